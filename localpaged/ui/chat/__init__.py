"""A chat tab: the conversation it shows, its toolbar and message box, and the turns it starts
(send, regenerate, edit)."""
