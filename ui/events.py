"""Gradio event handlers of the chat tabs and the sidebar: thin adapters from component values
to ChatController calls and back to component updates (rendering is `render.py`'s job).

The page has N_SLOTS chat tabs made up front; the session's `slots` state says which
conversation each shows (None: hidden). A streaming handler starts a Turn and then follows it;
`follow` re-attaches a tab to a turn that is already running (after a reload, say).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Iterator
from typing import Any

import gradio as gr

from . import render
from .controller import ChatController, ChatError
from .generation import SAMPLING_KEYS
from .store import StoreError

log = logging.getLogger(__name__)

N_SLOTS = 4
SLOT_FIELDS = 4 + 1 + len(SAMPLING_KEYS)   # tab, chatbot, selection text, selection; settings
USER_ERRORS = (ValueError, ChatError, StoreError, KeyError)


def skip_slot() -> list:
    return [gr.skip()] * SLOT_FIELDS


class Events:
    def __init__(self, ctl: ChatController) -> None:
        self.ctl = ctl

    # ---- one tab's components ---------------------------------------------------------------
    def fill(self, cid: int | None, sel: int | None = None, settings: bool = True) -> list:
        """Values for one slot: [tab, chatbot, selection text, selection, system prompt,
        *sampling]; a hidden tab for cid None."""
        if cid is None:
            return [gr.Tab(visible=False), [], "", None] + [gr.skip()] * (1 + len(SAMPLING_KEYS))
        view = self.ctl.view(cid)
        sel = len(view.path) - 1 if sel is None or sel >= len(view.path) else sel
        sel = None if sel < 0 else sel
        head = [gr.Tab(label=render.tab_label(view.conversation, view.busy), visible=True),
                render.chat_messages(view), render.selection_label(view, sel), sel]
        if not settings:
            return head + [gr.skip()] * (1 + len(SAMPLING_KEYS))
        system, sampling = self.ctl.settings(cid)
        return head + [system] + [sampling[k] for k in SAMPLING_KEYS]

    def chat_only(self, cid: int, sel: int | None = None) -> list:
        """[tab, chatbot, selection text, selection] of a tab."""
        return self.fill(cid, sel, settings=False)[:4]

    # ---- opening, closing and restoring tabs ---------------------------------------------
    def restore(self) -> list:
        """On page load: the tabs open before (across reloads and restarts)."""
        cids = self.ctl.open_tabs()[:N_SLOTS]
        if not cids:
            convs = self.ctl.search()
            cids = [convs[0].id if convs else self.ctl.new_conversation().id]
        slots = cids + [None] * (N_SLOTS - len(cids))
        return self._layout(slots, 0, changed=range(N_SLOTS))

    def open(self, slots: list, current: int, cid: int | None, refresh: bool = False) -> list:
        """Show conversation cid: its tab if open (re-read if `refresh`), else a free tab,
        else the current one (or any tab not generating)."""
        slots = list(slots or [None] * N_SLOTS)
        if cid is None:
            return self._layout(slots, current, changed=())
        if cid in slots:
            i = slots.index(cid)
            return self._layout(slots, i, changed=[i] if refresh else ())
        free = [i for i, c in enumerate(slots) if c is None]
        idle = [i for i, c in enumerate(slots) if not self.ctl.busy(c)]
        if not free and not idle:
            warn("Every tab is generating: stop or close one first.")
            return self._layout(slots, current, changed=())
        i = free[0] if free else (current if current in idle else idle[0])
        slots[i] = cid
        return self._layout(slots, i, changed=[i])

    def new(self, slots: list, current: int) -> list:
        return self.open(slots, current, self.ctl.new_conversation().id)

    def close(self, slots: list, i: int) -> list:
        slots = list(slots)
        if slots[i] is not None:
            self.ctl.stop(slots[i])
        slots[i] = None
        if not any(slots):
            slots[i] = self.ctl.new_conversation().id        # never an empty page
        visible = [j for j, c in enumerate(slots) if c is not None]
        return self._layout(slots, visible[0], changed=[i])

    def _layout(self, slots: list, current: int, changed) -> list:
        """[slots, current, tabs, *every slot's fields, sidebar] after a change of tabs."""
        self.ctl.save_open_tabs([c for c in slots if c is not None])
        out = [slots, current, gr.Tabs(selected=f"slot{current}")]
        for i in range(N_SLOTS):
            out += self.fill(slots[i]) if i in changed else skip_slot()
        return out + [self.sidebar_value(slots[current])]

    def sidebar_value(self, cid: int | None) -> Any:
        return gr.Radio(value=cid)

    def sidebar(self, query: str, slots: list, current: int) -> Any:
        convs = self.ctl.search(query or "")
        cid = (slots or [None])[current or 0]
        return gr.Radio(choices=render.conversation_choices(convs),
                        value=cid if cid in {c.id for c in convs} else None)

    def select_tab(self, slots: list, i: int) -> tuple:
        return i, gr.Radio(value=slots[i])

    # ---- generation ---------------------------------------------------------------------------
    def _settings(self, cid: int, system: str, values: tuple) -> None:
        self.ctl.update_settings(cid, system or "", dict(zip(SAMPLING_KEYS, values)))

    def save_settings(self, slots: list, i: int, system: str, *sampling) -> None:
        """A settings field was edited: keep it (a value the engine refuses is reported)."""
        if slots[i] is None:
            return
        try:
            self._settings(slots[i], system, sampling)
        except USER_ERRORS as exc:
            warn(_why(exc))

    def send(self, slots: list, i: int, text: str, system: str, *sampling) -> Iterator[list]:
        """Outputs: tab, chatbot, selection text, selection, message box."""
        cid = slots[i]
        try:
            self._settings(cid, system, sampling)
            turn = self.ctl.send(cid, text or "")
        except USER_ERRORS as exc:
            warn(_why(exc))
            yield self.chat_only(cid) + [gr.skip()]
            return
        yield self.chat_only(cid) + [""]
        for _ in self.follow_turn(cid, turn):
            yield self.chat_only(cid) + [gr.skip()]

    def regenerate(self, slots: list, i: int, sel: int | None, system: str, *sampling) -> Iterator[list]:
        return self._start(slots[i], lambda m: self.ctl.regenerate(m), sel, system, sampling)

    def edit(self, slots: list, i: int, sel: int | None, text: str, system: str,
             *sampling) -> Iterator[list]:
        return self._start(slots[i], lambda m: self.ctl.edit(m, text), sel, system, sampling)

    def _start(self, cid: int, start, sel: int | None, system: str, sampling) -> Iterator[list]:
        """Outputs: tab, chatbot, selection text, selection."""
        try:
            self._settings(cid, system, sampling)
            turn = start(self._message_id(cid, sel))
        except USER_ERRORS as exc:
            warn(_why(exc))
            yield self.chat_only(cid, sel)
            return
        for _ in self.follow_turn(cid, turn):
            yield self.chat_only(cid)

    def follow(self, slots: list, i: int) -> Iterator[list]:
        """Re-attach tab i to its conversation's running turn, if any."""
        cid = (slots or [None] * N_SLOTS)[i]
        turn = self.ctl.turn(cid) if cid is not None else None
        if turn is None or turn.done:
            yield [gr.skip()] * 4
            return
        for _ in self.follow_turn(cid, turn):
            yield self.chat_only(cid)

    def follow_turn(self, cid: int, turn) -> Iterator[None]:
        for t in turn.updates():
            if t.done and t.error:
                warn(f"Generation stopped: {t.error}")
            yield None

    def stop(self, slots: list, i: int) -> None:
        if slots[i] is not None:
            self.ctl.stop(slots[i])

    # ---- the message toolbar ----------------------------------------------------------------
    def _message_id(self, cid: int, sel: int | None) -> int:
        path = self.ctl.store.active_path(cid)
        if not path:
            raise ChatError("there is no message yet")
        return path[-1 if sel is None or sel >= len(path) else sel].id

    def select(self, slots: list, i: int, evt: gr.SelectData) -> list:
        index = evt.index if isinstance(evt.index, int) else (evt.index or [None])[0]
        return self.chat_only(slots[i], index)[2:]

    def switch(self, slots: list, i: int, sel: int | None, step: int) -> list:
        try:
            self.ctl.switch(self._message_id(slots[i], sel), step)
        except USER_ERRORS as exc:
            warn(_why(exc))
        return self.chat_only(slots[i], sel)

    def edit_open(self, slots: list, i: int, sel: int | None) -> tuple:
        """Show the edit box with the selected user message (outputs: row, box)."""
        try:
            msg = self.ctl.store.get_message(self._message_id(slots[i], sel))
        except USER_ERRORS as exc:
            warn(_why(exc))
            return gr.skip(), gr.skip()
        if msg.role != "user":
            warn("Select one of your own messages to edit it (click it in the chat).")
            return gr.skip(), gr.skip()
        return gr.Group(visible=True), msg.content

    def fork(self, slots: list, current: int, i: int, sel: int | None) -> list:
        try:
            conv = self.ctl.fork(self._message_id(slots[i], sel))
        except USER_ERRORS as exc:
            warn(_why(exc))
            return self.open(slots, current, None)
        info("Forked into a new conversation: it is open in a new tab.")
        return self.open(slots, current, conv.id)

    def export(self, slots: list, i: int) -> str:
        return self.ctl.export(slots[i], "markdown")

    # ---- sidebar: rename and delete -------------------------------------------------------
    def rename(self, cid: int | None, title: str) -> None:
        if cid is None:
            raise error("Pick a conversation in the list first.")
        try:
            self.ctl.rename(cid, title or "")
        except USER_ERRORS as exc:
            raise error(_why(exc)) from exc

    def delete(self, slots: list, current: int, cid: int | None) -> list:
        if cid is None:
            return self.open(slots, current, None)
        self.ctl.delete(cid)
        if cid in slots:
            return self.close(slots, slots.index(cid))
        return self.open(slots, current, None)

    def refresh_tabs(self, slots: list) -> list:
        """Every open tab's chat re-read (after a compare added replies to one of them)."""
        out = []
        for cid in slots:
            out += self.chat_only(cid) if cid is not None else [gr.skip()] * 4
        return out

    def titles(self, slots: list) -> list:
        """Every open tab's label (after a rename or a first message)."""
        return [self.fill(c, settings=False)[0] if c is not None else gr.skip() for c in slots]


def _why(exc: BaseException) -> str:
    return str(exc).strip("'\"") or type(exc).__name__


# Gradio renders toast messages as HTML: anything that may carry user text is escaped.
def warn(message: str) -> None:
    gr.Warning(html.escape(message))


def info(message: str) -> None:
    gr.Info(html.escape(message))


def error(message: str) -> gr.Error:
    return gr.Error(html.escape(message))
