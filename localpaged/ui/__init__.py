"""Chat app of localpaged: the Gradio UI, one folder per feature (view.py, events.py, logic.py;
the rule and the features are in app.py's docstring), and the conversation store (store/)."""
