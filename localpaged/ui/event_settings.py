"""Gradio event settings shared by every feature.

Generation events of every tab share one concurrency group with room for many at once, so
conversations stream side by side (in one engine batch); stop, switch and the rest are quick
events of their own (those of the tab set one at a time: TABS). The streaming text (with its ▌
cursor and the tab's ● mark) is the progress indicator, so Gradio's own is hidden.

A quick event clicked again while it still runs runs once more when it ends ("always_last"):
Gradio's default ("once") drops that click without a word, so a second "+ New chat" made a
moment after the first opened nothing. A generation event keeps "once" unless it says
otherwise (a send waits for the reply before it: chat/events.py).

Every event is private to the page (`api_visibility`): the app's API is /v1, and Gradio would
otherwise describe each event's inputs and outputs in the page it serves (every tab's outputs
for each page-level event: megabytes on every load).

Every event's progress is shown on one hidden marker (`quiet_progress`), not on its outputs.
Gradio's page keeps a loading status for each component that was ever an event's progress
target and, on every message of every event (each streamed chunk), writes all of them again:
with the page-level handlers writing into every tab's components, one hidden marker keeps that
to one update a chunk instead of one per component of every tab (bench/page_cost.py measures
the page's cost).
"""

from __future__ import annotations

import gradio as gr

GEN = {"concurrency_id": "generate", "concurrency_limit": 16, "show_progress": "hidden",
       "api_visibility": "private"}
QUICK = {"concurrency_id": "quick", "concurrency_limit": 8, "show_progress": "hidden",
         "api_visibility": "private", "trigger_mode": "always_last"}
# The events that change the tab set (select, new, open, close, fork) run one at a time, in the
# order they came: each saves the open tabs and the selected one, and two tab clicks a moment
# apart, run side by side, saved in either order (a reload then came back to the earlier tab).
TABS = {**QUICK, "concurrency_id": "tabs", "concurrency_limit": 1}


def quiet_progress(demo: gr.Blocks, marker: gr.components.Component) -> None:
    """Make `marker` the only progress target of every event of `demo` (ours hide their
    progress; Gradio's own, such as a component's value loaded by a function, would show it
    on the component): the page's per-message loading-status pass then touches one component
    instead of every output the page's events ever had."""
    for fn in demo.fns.values():
        fn.show_progress, fn.show_progress_on = "hidden", [marker]
