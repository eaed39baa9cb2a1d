"""The handlers of a chat tab's message actions and their wiring: select a message, copy its
text, switch its siblings (the ‹ › buttons, and a click on ‹ or › inside a message: SIBLING_JS,
wired by `wire_sibling_clicks`), open the edit box on it, fork the conversation there. Thin
adapters from component values to ChatController calls; each returns `TabValues` (PageValues
for a fork, which opens a tab). The tab's turns (send, regenerate, edit, stop) are
chat/events.py's (ChatEvents, a MessageEvents).
"""

from __future__ import annotations

import gradio as gr

from ..click_relay import inputs_js, relay_js
from ..controller import ChatController
from ..event_settings import QUICK, TABS
from ..tabs.events import Page, TabSet
from ..tabs.view import PageValues
from ..toasts import USER_ERRORS, info, warn, why
from .view import ChatTabUI, TabValues, tab_values


class MessageEvents:
    """Handlers of the message actions of chat tab i (`slots[i]` is its conversation); the
    base of chat/events.py's ChatEvents, whose `chat` is the tab's chat part."""

    def __init__(self, ctl: ChatController, tabset: TabSet) -> None:
        self.ctl, self.tabset = ctl, tabset

    def chat(self, cid: int | None, sel: int | None = None) -> TabValues:
        """The chat part of a tab (not its settings)."""
        return tab_values(self.ctl, cid, sel, settings=False)

    def select(self, slots: list, i: int, index) -> TabValues:
        index = index if isinstance(index, int) else (index or [None])[0]
        chat = self.chat(slots[i], index)
        return TabValues(sel_md=chat.sel_md, sel=chat.sel)

    def copy_source(self, slots: list, i: int, sel: int | None) -> TabValues:
        """The selected message's own text (its Markdown as written, a streaming reply's text
        so far) for the Copy button's clipboard step: the Chatbot holds HTML."""
        view = self.ctl.view(slots[i]) if slots[i] is not None else None
        if view is None or not view.path:
            warn("Nothing to copy yet.")
            return TabValues()
        msg = view.path[-1 if sel is None or not 0 <= sel < len(view.path) else sel]
        live = view.live.get(msg.id)
        return TabValues(sel_text=live.text if live else msg.content)

    def switch(self, slots: list, i: int, sel: int | None, step: int) -> TabValues:
        try:
            self.ctl.switch(self.ctl.message_at(slots[i], sel).id, step)
        except USER_ERRORS as exc:
            warn(why(exc))
        return self.chat(slots[i], sel)

    def switch_at(self, slots: list, i: int, nav: str) -> TabValues:
        """A click on ‹ or › in message `index` (nav: "index step", from SIBLING_JS): that
        message is selected and shows its sibling."""
        try:
            index, step = (int(x) for x in (nav or "").split()[:2])
        except ValueError:
            return TabValues()
        if step not in (-1, 1) or slots[i] is None:
            return TabValues()
        return self.switch(slots, i, index, step)

    def edit_open(self, slots: list, i: int, sel: int | None) -> TabValues:
        """Show the edit box with the selected user message."""
        try:
            msg = self.ctl.message_at(slots[i], sel)
        except USER_ERRORS as exc:
            warn(why(exc))
            return TabValues()
        if msg.role != "user":
            warn("Select one of your own messages to edit it (click it in the chat).")
            return TabValues()
        return TabValues(edit_row=gr.Group(visible=True), edit_box=msg.content)

    def fork(self, slots: list, current: int, i: int, sel: int | None) -> PageValues:
        try:
            conv = self.ctl.fork(self.ctl.message_at(slots[i], sel).id)
        except USER_ERRORS as exc:
            warn(why(exc))
            return self.tabset.open(slots, current, None)
        info("Forked into a new conversation: it is open in a new tab.")
        return self.tabset.open(slots, current, conv.id)

# Runs in the browser after copy_source filled the hidden textbox (the click's user activation
# still holds; 127.0.0.1 is a secure context, so navigator.clipboard exists).
COPY_JS = "(text) => { navigator.clipboard.writeText(text || ''); }"


# A click on a message's `‹ 2/3 ›` (render.footer: `<span class="lp-sib lp-at-{index}">`): its
# left half shows the previous version, its right half the next; "index step" goes to the
# tab's hidden `sibgo{i}` button, whose event hands it to MessageEvents.switch_at.
SIBLING_JS = relay_js("sibnav", ".lp-sib", "chat", "sibgo", """(el, e) => {
    const at = [...el.classList].find((c) => /^lp-at-\\d+$/.test(c));
    if (!at) return null;
    const r = el.getBoundingClientRect();
    return at.slice(6) + ' ' + (e.clientX < r.left + r.width / 2 ? -1 : 1); }""")
SIBLING_INPUTS_JS = inputs_js("sibnav", before=1)


def wire_sibling_clicks(loaded) -> None:
    """After the page loads: the listener that makes `‹ 2/3 ›` in messages clickable."""
    loaded.then(None, None, None, js=SIBLING_JS)


def wire_message_actions(ui: ChatTabUI, page: Page, events: MessageEvents) -> None:
    """The message actions of chat tab `ui.index`."""
    i, slots, current, out = ui.index, page.ui.slots, page.ui.current, ui.outputs()

    # An event-data handler spells out its parameters (Gradio injects event data by annotation).
    def select(slot_cids, evt: gr.SelectData) -> list:
        return ui.flatten(events.select(slot_cids, i, evt.index))

    def switch(step: int):
        return lambda c, sel: ui.flatten(events.switch(c, i, sel, step))

    ui.sibgo.click(lambda c, nav: ui.flatten(events.switch_at(c, i, nav)), [slots, ui.sibnav],
                   out, js=SIBLING_INPUTS_JS, **QUICK)
    ui.chatbot.select(select, slots, out, **QUICK)
    ui.prev.click(switch(-1), [slots, ui.sel], out, **QUICK)
    ui.next.click(switch(1), [slots, ui.sel], out, **QUICK)
    ui.edit.click(lambda c, sel: ui.flatten(events.edit_open(c, i, sel)), [slots, ui.sel], out,
                  **QUICK)
    ui.copy.click(lambda c, sel: ui.flatten(events.copy_source(c, i, sel)), [slots, ui.sel], out,
                  **QUICK).then(None, ui.sel_text, None, js=COPY_JS)
    forked = ui.fork.click(page.handler(lambda c, cur, sel: events.fork(c, cur, i, sel)),
                           [slots, current, ui.sel], page.ui.outputs(), **TABS)
    page.refresh_after(forked)
