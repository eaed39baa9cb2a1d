"""Tool calls, in parts: spec.py (the values), parsing.py (finding calls in a reply, streamed or
not), formats.py (the families and their grammars), prompt.py (messages for the chat template).
Callers import from `localpaged.chat.tool_calls`, the one public face of these modules."""
