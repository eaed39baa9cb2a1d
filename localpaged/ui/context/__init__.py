"""The conversation against the model's context window: the gauge under the message box, the
"when the conversation no longer fits" policy, Continue, and fitting each request."""
