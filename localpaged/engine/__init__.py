"""The engine: LLMEngine (add / step / abort), its output path (sampling, stops, request
outputs), the async driver the UI and the API use, and the offline LLM API."""
