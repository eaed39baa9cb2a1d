"""The context features' handlers and wiring on a chat tab: the gauge, the policy setting,
Continue, Compact (a streaming turn, followed as a reply is) and its prompt (saved on blur, as
the system prompt is), and the first screen
(the cursor starts in the message box, which is first in the tab order). The gauge follows the
draft as the user types (the message box's `.change`, with the trigger_mode "always_last" of
every quick event: keystrokes that arrive while a count runs collapse into one, a debounce that
never drops the last one); a change of the chat (a reply ended, a branch switched, a tab
opened) brings the gauge in the same update (chat/view.py `tab_values`), counted without the
draft, which the next keystroke adds again.
"""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from ..controller import ChatController
from ..event_settings import GEN, QUICK
from ..settings.logic import SAMPLING_KEYS, from_fields
from ..toasts import USER_ERRORS, info, warn, why
from .view import gauge_value

# Focus the shown chat's message box; the tab order starts with the message box, then Send, then
# Stop (then the page in order).
FOCUS_JS = """() => { setTimeout(() => {
  const boxes = [...document.querySelectorAll("[id^='msg'] textarea")];
  boxes.forEach((t) => t.setAttribute("tabindex", "1"));
  document.querySelectorAll("button[id^='send']").forEach((b) => b.setAttribute("tabindex", "2"));
  document.querySelectorAll("button[id^='stop']").forEach((b) => b.setAttribute("tabindex", "3"));
  const shown = boxes.find((t) => t.offsetParent !== null);
  if (shown) shown.focus();
}, 0); }"""


class ContextEvents:
    """Handlers of the context features of chat tab i (`slots[i]` is its conversation)."""

    def __init__(self, ctl: ChatController, chat_events) -> None:
        self.ctl, self.chat_events = ctl, chat_events

    def gauge(self, slots: list, i: int, draft: str, system: str | None = None,
              max_tokens=None):
        cid = (slots or [None] * (i + 1))[i]
        if cid is not None and self.ctl.busy(cid):
            return gr.skip()                    # the reply's end updates it
        return gauge_value(self.ctl, cid, draft, system, max_tokens)

    def set_policy(self, slots: list, i: int, policy: str) -> None:
        self._save(slots, i, self.ctl.set_context_policy, policy)

    def set_compact_prompt(self, slots: list, i: int, text: str) -> None:
        self._save(slots, i, self.ctl.set_compact_prompt, text)

    @staticmethod
    def _save(slots: list, i: int, setter, value) -> None:
        """One setting of tab i's conversation; a refused value is a toast saying why."""
        if slots[i] is None:
            return
        try:
            setter(slots[i], value)
        except USER_ERRORS as exc:
            warn(why(exc))

    def continue_reply(self, slots: list, i: int, sel: int | None, system: str,
                       *sampling) -> Iterator:
        """Continue the selected reply (or the last one when a user message is selected)."""
        cid = slots[i]
        try:
            msg = self.ctl.message_at(cid, sel)
        except USER_ERRORS as exc:
            warn(why(exc))
            return iter(())
        if msg.role != "assistant":
            sel = None
        return self.chat_events.start_turn(cid, self.ctl.continue_reply, sel, system, sampling)

    def compact(self, slots: list, i: int, system: str, *sampling) -> Iterator:
        """Save the settings fields, then compact the conversation into a new branch: the tab
        shows the summary as the model writes it (Stop cancels it, and the tab shows the
        conversation as it was), then the branch."""
        cid = slots[i]
        if cid is None:
            return
        try:
            checked = self.ctl.update_settings(cid, system or "", from_fields(sampling))
            turn = self.ctl.compact(cid, checked)
        except USER_ERRORS as exc:
            warn(why(exc))
            yield self.chat_events.chat(cid)
            return
        yield from self.chat_events.follow_turn(cid, turn)
        if turn.branched is not None:
            info("Compacted into a new branch: a summary and the recent turns. The original "
                 "is the other branch at the first message (‹).")
        elif turn.error is None:
            info("Compaction stopped: nothing was kept, the conversation is as it was.")


def wire_context(ui, page, events: ContextEvents) -> None:
    """The gauge, the policy setting and Continue of chat tab `ui.index`."""
    i, slots = ui.index, page.ui.slots
    settings, out = [ui.system, *ui.sampling], ui.outputs()

    def continue_(slot_cids, sel, system, *sampling) -> Iterator[list]:
        for v in events.continue_reply(slot_cids, i, sel, system, *sampling):
            yield ui.flatten(v)

    def compact(slot_cids, system, *sampling) -> Iterator[list]:
        for v in events.compact(slot_cids, i, system, *sampling):
            yield ui.flatten(v)

    def gauge(slot_cids, draft, system, max_tokens):
        return events.gauge(slot_cids, i, draft, system, max_tokens)

    gauge_in = [slots, ui.msg, ui.system, ui.sampling[SAMPLING_KEYS.index("max_tokens")]]

    ui.cont.click(continue_, [slots, ui.sel, *settings], out, **GEN)
    ui.compact.click(compact, [slots, *settings], out, **GEN)
    ui.compact_prompt.blur(lambda c, t: events.set_compact_prompt(c, i, t),
                           [slots, ui.compact_prompt], None, **QUICK)
    # (the chat's own changes bring their gauge with them: chat/view.py tab_values)
    for trigger in (ui.msg.change, ui.msg.focus, ui.system.input, gauge_in[-1].input):
        trigger(gauge, gauge_in, ui.gauge, **QUICK)
    ui.policy.input(lambda c, p: events.set_policy(c, i, p), [slots, ui.policy], None,
                    **QUICK).then(gauge, gauge_in, ui.gauge, **QUICK)
    ui.tab.select(None, None, None, js=FOCUS_JS)


def wire_first_screen(loaded) -> None:
    """After the page's tabs are restored: the cursor in the shown chat's message box."""
    loaded.then(None, None, None, js=FOCUS_JS)
