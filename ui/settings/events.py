"""Saving a chat tab's settings as they are edited: each field (the system prompt on blur, a
sampling field on input) saves itself and only itself, through `ChatController.update_setting`;
a value the engine refuses is reported and nothing is saved."""

from __future__ import annotations

import gradio as gr

from ..controller import ChatController
from ..queues import QUICK
from ..toasts import USER_ERRORS, warn, why
from .logic import PENALTY_KEYS, SAMPLING_KEYS


def save_setting(ctl: ChatController, slots: list, i: int, key: str, value) -> None:
    """Tab i's field `key` was edited: keep it, and only it (the other fields' values sent with
    the event may lag behind the page)."""
    if slots[i] is None:
        return
    try:
        ctl.update_setting(slots[i], key, value)
    except USER_ERRORS as exc:
        warn(why(exc))


def wire_settings(system: gr.Textbox, sampling: list, ctl: ChatController, slots: gr.State,
                  i: int, penalties: list = ()) -> None:
    """Each field saves itself: the system prompt, the sampling fields (SAMPLING_KEYS order)
    and the penalty fields (PENALTY_KEYS order)."""
    keys = ("system_prompt", *SAMPLING_KEYS, *PENALTY_KEYS[:len(penalties)])
    for key, f in zip(keys, (system, *sampling, *penalties)):
        edited = f.blur if f is system else f.input
        edited(lambda c, v, key=key: save_setting(ctl, c, i, key, v), [slots, f], None, **QUICK)
