"""A chat tab's options for replies prepared in the background (see logic.py): how many
alternatives to prepare after each reply (auto, off, 1, 2, 3) and whether to keep the ones
never opened. Built in the tab's settings accordion; their values are the `prepare` field of
the tab's TabValues (`prepare_values`, read by `chat.view.tab_values`).
"""

from __future__ import annotations

import gradio as gr

from ..controller import ChatController

CHOICES = [("auto", "auto"), ("off", "0"), ("1", "1"), ("2", "2"), ("3", "3")]


def build_prepare_fields(i: int) -> list:
    """[alternatives radio, keep-unopened checkbox]."""
    k = gr.Radio(CHOICES, value="auto", label="Prepare alternatives in the background",
                 info="After each reply, at low priority; Regenerate or ‹ › then shows one at "
                      "once. auto: 1 on a GPU, off on a CPU. Needs the local engine.",
                 elem_id=f"prep{i}")
    keep = gr.Checkbox(value=True, label="Keep prepared replies I never opened",
                       elem_id=f"prepkeep{i}")
    return [k, keep]


def prepare_values(ctl: ChatController, cid: int) -> list:
    opts = ctl.prepared.options(cid)
    return ["auto" if opts.alternatives is None else str(opts.alternatives), opts.keep_unopened]
