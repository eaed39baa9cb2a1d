"""The handlers of a chat tab and their wiring: send, regenerate, edit (toolbar and inline),
retry, close, stop; the message actions (select, copy, switch siblings, open the edit box, fork)
are chat/message_events.py's, and the tab's other features (settings, presets, export, edit
preview, prepared options) are wired here by their own `events.py`. Thin adapters from component
values to ChatController calls; each returns `TabValues` (or PageValues for what changes the tab
set), rendering is `render.py`'s job.

A turn starts from the tab's settings fields: they are saved first, and the send uses the
sampling settings that save checked (`_settings`), so one send checks them once. A message sent
while the conversation's reply streams waits for it and is sent then (queued, see keyboard.py).
Under "Stop and ask me" a send, regenerate or edit that no longer fits opens the tab's dialog
(drop the oldest and go on, edit, cancel; `ask_drop` does what it asked about). Under
"compact" such a request's turn streams the summary first (context/compact.py); stopped there,
a send's text goes back into the message box. A streaming handler starts a Turn and then
follows it; `follow` re-attaches a tab to a turn that is already running (after a reload,
say). The turn outlives the event (see turns.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path

import gradio as gr

from ..context.compact import CompactTurn
from ..controller import ContextAsk
from ..edit_preview.events import wire_edit_cost
from ..delete_branch.events import DeleteBranchEvents, wire_delete_branch
from ..export.events import wire_export
from ..prepared.events import wire_prepare_fields
from ..redraw import RedrawInterval
from ..event_settings import GEN, QUICK, TABS
from ..settings.events import wire_presets, wire_settings
from ..settings.logic import Sampling, from_fields
from ..tabs.events import Page
from ..tabs.view import N_SLOTS
from ..tools.events import wire_approval, wire_tool_settings
from ..tools.messages import read_attachment
from ..toasts import USER_ERRORS, warn, why
from ..values import KEEP, changes
from .message_events import MessageEvents, wire_message_actions
from .view import ChatTabUI, TabValues, ask_values, asked_for, tab_update

log = logging.getLogger(__name__)

QUEUE_WAIT_S = 600.0        # the longest a message sent during a reply waits for it to end
# A streaming reply's tab label (its ● mark) is sent when it changes and, during the turn's
# first LABEL_AGAIN_FOR_S, again every LABEL_AGAIN_S, shown or not: a label sent only at the start
# can go unshown on the page (test_ui_browser's two tabs starting at once, the one in the
# background too). Not for longer: every label update costs the page a pass over the whole tab
# (bench/page_cost.py measures four tabs streaming).
LABEL_AGAIN_S, LABEL_AGAIN_FOR_S = 1.0, 5.0
NOTHING_TO_REGENERATE = ("Nothing to regenerate yet: this chat has no message. Send one first; "
                         "Regenerate then writes a new reply beside the last one.")


class _LabelRepeats:
    """When a streaming reply's tab label goes out again: every LABEL_AGAIN_S during the turn's
    first LABEL_AGAIN_FOR_S (see there)."""

    def __init__(self) -> None:
        self.start, self.last = time.monotonic(), -math.inf      # never sent yet

    def due(self) -> bool:
        now = time.monotonic()
        return now - self.last >= LABEL_AGAIN_S and now - self.start < LABEL_AGAIN_FOR_S

    def sent(self) -> None:
        self.last = time.monotonic()


class ChatEvents(MessageEvents):
    """Handlers of chat tab i (`slots[i]` is its conversation); its message actions are
    MessageEvents' (chat/message_events.py)."""

    def _settings(self, cid: int, system: str, sampling: tuple) -> Sampling:
        """Save the tab's settings fields; the sampling settings, checked, for the turn."""
        return self.ctl.update_settings(cid, system or "", from_fields(sampling))

    def send(self, slots: list, i: int, text: str, system: str, *sampling,
             policy: str | None = None, files: list | None = None) -> Iterator[TabValues]:
        """Send the message box's text, with the text of the attached `files` (paths); while
        the conversation's reply streams, wait for it to end first (the message is queued, not
        dropped). Under "Stop and ask me", a conversation that no longer fits opens the tab's
        dialog instead (the text and the files stay); `policy` is the dialog's choice for this
        one request. A file that cannot be read is a toast naming it, and nothing is sent."""
        cid = slots[i]
        running = self.ctl.turn(cid) if cid is not None else None
        if running is not None and not running.done and ((text or "").strip() or files):
            running.wait(QUEUE_WAIT_S)      # queued: sent once the streaming reply ends
        try:
            attachments = [read_attachment(f) for f in files or []] or None
            turn = self.ctl.send(cid, text or "", self._settings(cid, system, sampling), policy,
                                 attachments=attachments)
        except ContextAsk as exc:
            yield self._asking(cid, exc.dropped)
            return
        except (*USER_ERRORS, OSError) as exc:       # OSError: an attached file went missing
            warn(why(exc))
            yield self.chat(cid)
            return
        first = self.chat(cid)
        first.msg, first.ask = "", gr.Column(visible=False)
        if files:
            first.attach = gr.File(value=None, visible=False)
        yield first
        yield from self.follow_turn(cid, turn)
        # the whole tab again with the dialog closed: a page that fell behind the stream
        # may have been handed only the latest of the updates above
        last = self.chat(cid)
        last.ask = gr.Column(visible=False)
        if isinstance(turn, CompactTurn) and turn.then is None:   # stopped before it was sent
            last.msg = text
            if files:
                last.attach = gr.File(value=list(files), visible=True)
        yield last

    def send_dropping(self, slots: list, i: int, text: str, system: str, *sampling,
                      files: list | None = None) -> Iterator[TabValues]:
        """The dialog's "drop the oldest" for a send: it leaves out the oldest messages."""
        return self.send(slots, i, text, system, *sampling, policy="drop_oldest", files=files)

    def _asking(self, cid: int, dropped: int, asked: dict | None = None,
                sel: int | None = None) -> TabValues:
        """The tab with the "Stop and ask me" dialog open (see ask_values)."""
        values = self.chat(cid, sel)
        for name, value in ask_values(dropped, asked).items():
            setattr(values, name, value)
        return values

    def ask_drop(self, slots: list, i: int, asked: dict | None, text: str, edited: str,
                 system: str, *sampling, files: list | None = None) -> Iterator[TabValues]:
        """The dialog's "drop the oldest": what it asked about (a send of the message box, a
        regenerate, an edit with the edit box's text) once with the oldest messages left out."""
        if not asked:
            yield from self.send_dropping(slots, i, text, system, *sampling, files=files)
            return
        if asked.get("action") == "edit":
            def start(m, s):
                return self.ctl.edit(m, edited, s, "drop_oldest")
        else:
            def start(m, s):
                return self.ctl.regenerate(m, s, "drop_oldest")
        closed = TabValues(ask=gr.Column(visible=False), edit_row=gr.Group(visible=False))
        yield closed
        yield from self._turn_on(slots[i], int(asked["message_id"]), start, system, sampling)

    def regenerate(self, slots: list, i: int, sel: int | None, system: str,
                   *sampling) -> Iterator[TabValues]:
        """A new reply beside the selected one; on a chat with no message yet, a toast says
        why there is nothing to regenerate (the settings are still saved)."""
        cid = slots[i]
        if cid is not None and not self.ctl.view(cid).path:
            self._settings(cid, system, sampling)
            warn(NOTHING_TO_REGENERATE)
            return iter([self.chat(cid)])
        return self.start_turn(cid, self.ctl.regenerate, sel, system, sampling,
                               asks="regenerate")

    def edit(self, slots: list, i: int, sel: int | None, text: str, system: str,
             *sampling) -> Iterator[TabValues]:
        return self.start_turn(slots[i], lambda m, s: self.ctl.edit(m, text, s), sel, system,
                               sampling, asks="edit", text=text)

    def start_turn(self, cid: int, start, sel: int | None, system: str, sampling,
                   asks: str | None = None, text: str = "") -> Iterator[TabValues]:
        """`start(message_id, sampling)` on the selected message, after saving the settings
        fields (their check's result is `sampling`), then follow the turn it returns. `asks`:
        what a request that no longer fits under "Stop and ask me" opens the dialog for
        ("regenerate", "edit" with its `text`); without it, a toast says why."""
        try:
            message_id = self.ctl.message_at(cid, sel).id
        except USER_ERRORS as exc:
            warn(why(exc))
            yield self.chat(cid, sel)
            return
        yield from self._turn_on(cid, message_id, start, system, sampling, asks, text, sel)

    def _turn_on(self, cid: int, message_id: int, start, system: str, sampling,
                 asks: str | None = None, text: str = "",
                 sel: int | None = None) -> Iterator[TabValues]:
        try:
            turn = start(message_id, self._settings(cid, system, sampling))
        except ContextAsk as exc:
            if asks is None:
                warn(why(exc))
                yield self.chat(cid, sel)
                return
            asked = self._asking(cid, exc.dropped, asked_for(asks, message_id, text), sel)
            if asks == "edit":                       # the edited text stays in its box
                asked.edit_row, asked.edit_box = gr.Group(visible=True), text
            yield asked
            return
        except USER_ERRORS as exc:
            warn(why(exc))
            yield self.chat(cid, sel)
            return
        yield from self.follow_turn(cid, turn)

    def follow(self, slots: list, i: int) -> Iterator[TabValues]:
        """Re-attach tab i to its conversation's running turn, if any."""
        cid = (slots or [None] * N_SLOTS)[i]
        turn = self.ctl.turn(cid) if cid is not None else None
        if turn is None or turn.done:
            yield TabValues()
            return
        yield from self.follow_turn(cid, turn)

    def follow_turn(self, cid: int, turn) -> Iterator[TabValues]:
        """The tab's values as the turn streams: each update only what changed since the
        last (the label when it changes, and again now and then: LABEL_AGAIN_S); while the tab
        is not shown, its label only (the chat is redrawn once shown, or at the end)."""
        shown, label = None, _LabelRepeats()
        interval = RedrawInterval(self.ctl.current_tab, cid)
        for t in turn.updates(interval):
            if t.done and t.error:
                warn(f"Generation stopped: {t.error}")
            if shown is not None and not t.done and not interval.shown:
                if label.due():
                    label.sent()
                    yield TabValues(tab=tab_update(self.ctl.view(cid)))
                continue
            now = self.chat(cid)
            step = changes(shown, now)
            if step.tab is not KEEP or label.due():
                step.tab = now.tab
                label.sent()
            yield step
            shown = now

    def stop(self, slots: list, i: int) -> None:
        if slots[i] is not None:
            self.ctl.stop(slots[i])


def wire_chat_tab(ui: ChatTabUI, page: Page, events: ChatEvents) -> None:
    """The events of chat tab `ui.index`."""
    i, slots = ui.index, page.ui.slots
    settings, out = [ui.system, *ui.sampling], ui.outputs()
    hidden = TabValues(edit_row=gr.Group(visible=False))

    # Streaming handlers must be real generator functions; event-data handlers spell out
    # their parameters (Gradio injects event data by annotation).
    def send(slot_cids, text, files, system, *sampling) -> Iterator[list]:
        for v in events.send(slot_cids, i, text, system, *sampling, files=files):
            yield ui.flatten(v)

    def regenerate(slot_cids, sel, system, *sampling) -> Iterator[list]:
        for v in events.regenerate(slot_cids, i, sel, system, *sampling):
            yield ui.flatten(v)

    def retry(slot_cids, system, temperature, top_p, top_k, min_p, seed, max_tokens,
              evt: gr.RetryData) -> Iterator[list]:
        for v in events.regenerate(slot_cids, i, evt.index, system, temperature, top_p, top_k,
                                   min_p, seed, max_tokens):
            yield ui.flatten(v)

    def edit(slot_cids, sel, text, system, *sampling) -> Iterator[list]:
        for v in events.edit(slot_cids, i, sel, text, system, *sampling):
            yield ui.flatten(v)

    def follow(slot_cids) -> Iterator[list]:
        for v in events.follow(slot_cids, i):
            yield ui.flatten(v)

    def ask_drop(slot_cids, asked, text, edited, files, system, *sampling) -> Iterator[list]:
        for v in events.ask_drop(slot_cids, i, asked, text, edited, system, *sampling,
                                 files=files):
            yield ui.flatten(v)

    def attach(new: list | None, attached: list | None):
        """Files picked with 📎 Attach join those already attached (a name once)."""
        have = list(attached or [])
        names = {Path(f).name for f in have}
        have += [f for f in new or [] if Path(f).name not in names]
        return gr.File(value=have, visible=bool(have))

    # "always_last": a message sent while this tab's reply streams waits for that event to end
    # (its turn) and is sent then (Gradio's default, "once", dropped it silently); the page
    # says it is queued (keyboard.py).
    for trigger in (ui.send.click, ui.msg.submit):
        page.refresh_after(trigger(send, [slots, ui.msg, ui.attach, *settings], out,
                                   trigger_mode="always_last", **GEN))
    closed = TabValues(ask=gr.Column(visible=False))
    ask = ui.ask_ui
    page.refresh_after(ask.drop.click(ask_drop, [slots, ui.ask_for, ui.msg, ui.edit_box,
                                                 ui.attach, *settings], out, **GEN))
    ui.attach_button.upload(attach, [ui.attach_button, ui.attach], ui.attach, **QUICK)
    # the last file's × empties the list: it hides again
    ui.attach.clear(lambda: gr.File(visible=False), None, ui.attach, **QUICK)
    ask.cancel.click(lambda: ui.flatten(closed), None, out, **QUICK)
    ask.edit.click(lambda: ui.flatten(closed), None, out, **QUICK).then(
        None, None, None, js=f"() => {{ const t = document.querySelector('#msg{i} textarea');"
                             " if (t) { t.focus(); t.setSelectionRange(t.value.length,"
                             " t.value.length); } }")
    page.refresh_after(ui.regen.click(regenerate, [slots, ui.sel, *settings], out, **GEN))
    ui.chatbot.retry(retry, [slots, *settings], out, **GEN)
    ui.stop.click(lambda c: events.stop(c, i), slots, None, **QUICK)
    ui.edit_save.click(lambda: ui.flatten(hidden), None, out, **QUICK)
    ui.edit_save.click(edit, [slots, ui.sel, ui.edit_box, *settings], out, **GEN)
    ui.edit_cancel.click(lambda: ui.flatten(hidden), None, out, **QUICK)
    ui.close.click(page.handler(lambda c: events.tabset.close(c, i)), slots, page.ui.outputs(),
                   **TABS)
    ui.tab.select(page.handler(lambda c: events.tabset.select_tab(c, i)), slots,
                  page.ui.outputs(), **TABS)
    wire_export(ui.export, events.ctl, slots, i, **QUICK)
    wire_message_actions(ui, page, events)
    wire_delete_branch(ui, page, DeleteBranchEvents(events.ctl))
    wire_edit_cost(ui.edit_cost, ui.edit_box, events.ctl, slots, ui.sel, i)
    wire_prepare_fields(ui.prepare, events.ctl, slots, i)
    wire_settings(ui.system, ui.sampling, events.ctl, slots, i, ui.extras)
    wire_presets(ui, events.ctl, slots, i)
    wire_tool_settings(ui.tool_ui, events.ctl, slots, i)
    wire_approval(ui.approval_ui, events.ctl, slots, i)
    page.followers.append((follow, out))
