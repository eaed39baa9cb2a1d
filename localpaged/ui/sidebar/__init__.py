"""The sidebar: new chat, search, the list of conversations, rename and delete."""
