"""Saving a chat tab's settings as they are edited: each field (the system prompt on blur, a
sampling or penalty field on input) saves itself and only itself, through
`ChatController.update_setting`; a value the engine refuses is reported and nothing is saved.
The presets row: choosing a preset fills the system prompt, "Save preset" keeps the system
prompt under a name, "Use these settings for new chats" makes them the defaults
(settings/presets.py)."""

from __future__ import annotations

import gradio as gr

from ..chat.view import TabValues
from ..controller import ChatController
from ..event_settings import QUICK
from ..toasts import USER_ERRORS, info, warn, why
from .logic import EXTRA_KEYS, SAMPLING_KEYS


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
                  i: int, extras: list = ()) -> None:
    """Each field saves itself: the system prompt, the sampling fields (SAMPLING_KEYS order)
    and the third row's (EXTRA_KEYS order)."""
    keys = ("system_prompt", *SAMPLING_KEYS, *EXTRA_KEYS[:len(extras)])
    for key, f in zip(keys, (system, *sampling, *extras)):
        edited = f.blur if f is system else f.input
        edited(lambda c, v, key=key: save_setting(ctl, c, i, key, v), [slots, f], None, **QUICK)


class PresetEvents:
    """Handlers of tab i's presets row; each returns the tab's TabValues (or nothing)."""

    def __init__(self, ctl: ChatController) -> None:
        self.ctl = ctl

    def choose_preset(self, slots: list, i: int, name: str | None) -> TabValues:
        if slots[i] is None or not name:
            return TabValues()
        try:
            return TabValues(system=self.ctl.apply_preset(slots[i], name))
        except USER_ERRORS as exc:
            warn(why(exc))
            return TabValues()

    def save_preset(self, slots: list, i: int, name: str, system: str) -> TabValues:
        try:
            if slots[i] is not None:
                self.ctl.update_setting(slots[i], "system_prompt", system or "")
            saved = self.ctl.save_preset(name or "", system or "")
        except USER_ERRORS as exc:
            warn(why(exc))
            return TabValues()
        info(f"Saved the preset “{saved}”.")
        return TabValues(preset=gr.Dropdown(choices=self.ctl.preset_names(), value=saved),
                         preset_name="")

    def make_default(self, slots: list, i: int, system: str, *fields) -> None:
        """The tab's fields as shown (system prompt, then SAMPLING_KEYS and EXTRA_KEYS
        values: a field's own save may not have landed yet) become the conversation's settings
        and the defaults of new chats."""
        if slots[i] is None:
            return
        try:
            self.ctl.update_settings(slots[i], system or "",
                                     dict(zip(SAMPLING_KEYS + EXTRA_KEYS, fields)))
            self.ctl.save_defaults(slots[i])
        except USER_ERRORS as exc:
            warn(why(exc))
            return
        info("New chats will start with this conversation's system prompt and settings.")


def wire_presets(ui, ctl: ChatController, slots: gr.State, i: int) -> None:
    """The presets row of chat tab `ui` (a chat.view.ChatTabUI)."""
    events, out = PresetEvents(ctl), ui.outputs()
    ui.preset.input(lambda c, name: ui.flatten(events.choose_preset(c, i, name)),
                    [slots, ui.preset], out, **QUICK)
    ui.presets.save.click(lambda c, name, system: ui.flatten(events.save_preset(c, i, name, system)),
                          [slots, ui.preset_name, ui.system], out, **QUICK)
    ui.presets.make_default.click(lambda c, *v: events.make_default(c, i, *v),
                                  [slots, ui.system, *ui.sampling, *ui.extras], None, **QUICK)
