"""Gradio event settings shared by every feature.

Generation events of every tab share one concurrency group with room for many at once, so
conversations stream side by side (in one engine batch); stop, switch and the rest are quick
events of their own. The streaming text (with its ▌ cursor and the tab's ● mark) is the
progress indicator, so Gradio's own is hidden.

Every event is private to the page (`api_visibility`): the app's API is /v1, and Gradio would
otherwise describe each event's inputs and outputs in the page it serves (every tab's outputs
for each page-level event: megabytes on every load).
"""

GEN = {"concurrency_id": "generate", "concurrency_limit": 16, "show_progress": "hidden",
       "api_visibility": "private"}
QUICK = {"concurrency_id": "quick", "concurrency_limit": 8, "show_progress": "hidden",
         "api_visibility": "private"}
