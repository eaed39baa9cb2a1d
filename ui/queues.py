"""Gradio event settings shared by every feature.

Generation events of every tab share one concurrency group with room for many at once, so
conversations stream side by side (in one engine batch); stop, switch and the rest are quick
events of their own. The streaming text (with its ▌ cursor and the tab's ● mark) is the
progress indicator, so Gradio's own is hidden.
"""

GEN = {"concurrency_id": "generate", "concurrency_limit": 16, "show_progress": "hidden"}
QUICK = {"concurrency_id": "quick", "concurrency_limit": 8, "show_progress": "hidden"}
