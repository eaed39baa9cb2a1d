"""Export of a chat tab's conversation: Markdown (the shown path) and JSON (the whole tree),
written to private files (`files.py`)."""
