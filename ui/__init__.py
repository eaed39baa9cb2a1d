"""Chat app of localpaged: Gradio UI and the conversation store."""
