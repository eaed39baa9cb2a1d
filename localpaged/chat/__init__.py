"""Chat over an engine: the ChatBackend seam (local engine or a remote OpenAI-compatible server),
fitting a conversation into the context window, continuing a reply."""
