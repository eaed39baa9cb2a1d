"""Saving a chat tab's prepared-alternatives options as they change (a value out of range is
reported, nothing is saved)."""

from __future__ import annotations

import gradio as gr

from ..controller import ChatController
from ..event_settings import QUICK
from ..toasts import USER_ERRORS, warn, why


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
