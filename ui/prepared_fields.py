"""A chat tab's options for replies prepared in the background (see prepared.py): how many
alternatives to prepare after each reply (auto, off, 1, 2, 3) and whether to keep the ones
never opened. Built in the tab's settings accordion, loaded by `chat_tab.tab_values` (the
`prepare` field of TabValues), saved as they change.
"""

from __future__ import annotations

import gradio as gr

from .controller import ChatController
from .queues import QUICK
from .toasts import USER_ERRORS, warn, why

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


def wire_prepare_fields(fields: list, ctl: ChatController, slots: gr.State, i: int) -> None:
    def save(slot_cids: list, k: str, keep: bool) -> None:
        if slot_cids[i] is None:
            return
        try:
            ctl.prepared.set_options(slot_cids[i], k, bool(keep))
        except USER_ERRORS as exc:
            warn(why(exc))

    for f in fields:
        f.input(save, [slots, *fields], None, **QUICK)
