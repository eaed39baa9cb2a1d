"""The token view's handlers and wiring on a chat tab: open it on the selected reply, pick a
token (a click in the panel: TOKEN_JS), branch from it with an alternative, close."""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from ..click_relay import inputs_js, relay_js
from ..controller import ChatController
from ..event_settings import GEN, QUICK
from ..toasts import USER_ERRORS, warn, why
from .view import alternative_choices, tokens_html

NO_REPLY = "Select a reply first (click it): the token view shows a reply's tokens."

# A click on a token in a tab's token panel: "message id, index" to the panel's hidden button.
TOKEN_JS = relay_js("tokpick", ".lp-tok", "tokhtml", "tokgo", """(el) => {
    const at = [...el.classList].find((c) => /^lp-t-\\d+$/.test(c));
    const text = el.closest('.lp-toktext');
    const m = text ? [...text.classList].find((c) => /^lp-m-\\d+$/.test(c)) : null;
    return at && m ? m.slice(5) + ' ' + at.slice(5) : null; }""")
TOKEN_INPUTS_JS = inputs_js("tokpick")

_CLOSED = (gr.Group(visible=False), None, gr.Radio(visible=False, choices=[], value=None),
           gr.Button(visible=False))


class TokenEvents:
    """Handlers of the token view of chat tab i (`slots[i]` is its conversation)."""

    def __init__(self, ctl: ChatController, chat_events) -> None:
        self.ctl, self.chat_events = ctl, chat_events

    def open(self, slots: list, i: int, sel: int | None):
        """The panel on the selected reply: its tokens, nothing picked yet."""
        cid = slots[i]
        try:
            msg = self.ctl.message_at(cid, sel) if cid is not None else None
            tokens = self.ctl.reply_tokens(msg.id) if msg is not None else None
        except USER_ERRORS as exc:
            warn(why(exc))
            return _CLOSED + ("",)
        if msg is None or msg.role != "assistant":
            warn(NO_REPLY)
            return _CLOSED + ("",)
        if tokens is None:
            warn("This reply kept no token data (a remote model's, an imported or an older "
                 "reply): regenerate it with the local engine to see its tokens.")
            return _CLOSED + ("",)
        return (gr.Group(visible=True), (msg.id, None),
                gr.Radio(visible=False, choices=[], value=None), gr.Button(visible=False),
                tokens_html(msg.id, tokens))

    def pick(self, clicked: str):
        """A click on token `clicked` ("message id, index"): its alternatives to branch with."""
        try:
            mid, index = (int(x) for x in str(clicked).split())
            tokens = self.ctl.reply_tokens(mid)
        except (ValueError, *USER_ERRORS):
            tokens = None
        if tokens is None or not 0 <= index < len(tokens):
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        token = tokens[index]
        label = f"Token {index + 1} of {len(tokens)}: “{token.text}” ({token.prob:.1%})"
        return ((mid, index), gr.Radio(visible=True, label=label,
                                       choices=alternative_choices(token), value=None),
                gr.Button(visible=True), tokens_html(mid, tokens, index))

    def branch(self, slots: list, i: int, at, choice: str | None, system: str,
               *sampling) -> Iterator:
        """A sibling reply from the picked token with the alternative chosen, streamed."""
        cid = slots[i]
        if not at or at[1] is None or not choice:
            warn("Click a token, then choose one of its alternatives.")
            return iter(())
        mid, index = at

        def start(_selected: int, checked):
            return self.ctl.branch_at_token(mid, index, int(choice), checked)
        return self.chat_events.start_turn(cid, start, None, system, sampling)


def wire_tokens(ui, page, events: TokenEvents) -> None:
    """The token view of chat tab `ui.index`."""
    i, slots, t = ui.index, page.ui.slots, ui.tokens
    settings, out = [ui.system, *ui.sampling], ui.outputs()
    panel_out = [t.panel, t.at, t.alternatives, t.branch, t.html]

    def branch(slot_cids, at, choice, system, *sampling) -> Iterator[list]:
        for v in events.branch(slot_cids, i, at, choice, system, *sampling):
            yield ui.flatten(v)

    t.button.click(lambda c, sel: events.open(c, i, sel), [slots, ui.sel], panel_out, **QUICK)
    t.go.click(events.pick, t.pick, [t.at, t.alternatives, t.branch, t.html],
               js=TOKEN_INPUTS_JS, **QUICK)
    t.close.click(lambda: _CLOSED, None, panel_out[:4], **QUICK)
    # the panel hides at once; the branch's inputs (the token, the alternative) keep their values
    t.branch.click(lambda: gr.Group(visible=False), None, t.panel, **QUICK)
    page.refresh_after(t.branch.click(branch, [slots, t.at, t.alternatives, *settings], out,
                                      **GEN))


def wire_token_clicks(loaded) -> None:
    """After the page loads: the listener that makes tokens in the token panels clickable."""
    loaded.then(None, None, None, js=TOKEN_JS)
