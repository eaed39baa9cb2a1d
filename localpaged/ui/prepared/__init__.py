"""Replies prepared in the background: alternatives made at low priority after each reply, shown
by Regenerate and ‹ › without a new request, and a chat tab's options for them."""
