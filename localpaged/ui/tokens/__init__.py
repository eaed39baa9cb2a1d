"""A reply token by token: its probabilities and alternatives, and a branch at any token."""
