"""The cost preview's handler and wiring: recomputed on every change of the Edit box (opening
it included), through `ChatController.edit_cost`."""

from __future__ import annotations

import gradio as gr

from ..controller import ChatController
from ..event_settings import QUICK
from ..toasts import USER_ERRORS
from .view import cost_text


def preview(ctl: ChatController, cid: int | None, sel: int | None, text: str) -> str:
    """The preview for editing message `sel` of the tab's path into `text` ("" when none)."""
    if cid is None or not (text or "").strip():
        return ""
    try:
        cost = ctl.edit_cost(ctl.message_at(cid, sel).id, text)
    except USER_ERRORS:
        return ""                           # nothing selected, or deleted meanwhile
    return cost_text(*cost) if cost else ""


def wire_edit_cost(md: gr.Markdown, edit_box: gr.Textbox, ctl: ChatController, slots: gr.State,
                   sel: gr.State, i: int) -> None:
    edit_box.change(lambda c, s, text: preview(ctl, c[i], s, text), [slots, sel, edit_box], md,
                    **QUICK)
