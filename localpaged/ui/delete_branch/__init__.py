"""Deleting a message and the branch below it, after the user confirms (see logic.py)."""
