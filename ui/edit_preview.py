"""The cost preview under the Edit box (issue 10 item 4): while the user edits a message, what
the new branch will reuse from the KV prefix cache and what it must prefill, e.g. "Reuses 1,184
tokens from the cache, prefills 37." The numbers come from `ChatController.edit_cost` (the
engine's prefix cache, through the chat backend); they are the `num_cached_tokens` the engine
reports when the edit is then saved, unless the cache changes in between (other requests may
evict blocks). Over a remote backend there is no preview.
"""

from __future__ import annotations

import gradio as gr

from .controller import ChatController
from .queues import QUICK
from .toasts import USER_ERRORS


def cost_text(reused: int | None, prefill: int | None) -> str:
    if reused is None or prefill is None:
        return ""
    return f"Reuses {reused:,} tokens from the cache, prefills {prefill:,}."


def build_edit_cost(i: int) -> gr.Markdown:
    return gr.Markdown("", elem_id=f"editcost{i}", elem_classes="lp-meta")


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
    """Recompute on every change of the edit box (opening it included)."""
    edit_box.change(lambda c, s, text: preview(ctl, c[i], s, text), [slots, sel, edit_box], md,
                    trigger_mode="always_last", **QUICK)
