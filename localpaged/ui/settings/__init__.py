"""A conversation's settings: its system prompt and sampling settings (the fields, saving one as
it is edited, checking them and making the engine's SamplingParams from them)."""
