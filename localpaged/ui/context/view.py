"""The context features' components on a chat tab: the context gauge under the message box, the
per-conversation "when the conversation no longer fits" setting and its compaction prompt, the
Continue and Compact buttons, made
by `chat.view.build_chat_tab` through the small builders here (so they sit where they belong on
the tab); `gauge_html` draws `ContextUsage` from numbers and fixed strings only, `gauge_value`
is the gauge of a conversation (the `gauge` field of TabValues).
"""

from __future__ import annotations

import gradio as gr

from ..controller import ChatController
from ..toasts import USER_ERRORS
from .logic import POLICY_LABELS, ContextUsage

GAUGE_EMPTY = "<div class='lp-gauge lp-gauge-unknown'></div>"


def build_gauge(i: int) -> gr.HTML:
    return gr.HTML(GAUGE_EMPTY, elem_id=f"gauge{i}", elem_classes="lp-gauge-row",
                   js_on_load=None, padding=False)


def build_continue(i: int) -> gr.Button:
    return gr.Button("▸ Continue", size="sm", elem_id=f"cont{i}", scale=0, min_width=100)


def build_compact(i: int) -> gr.Button:
    return gr.Button("🗜 Compact", size="sm", elem_id=f"compact{i}", scale=0, min_width=100)


def build_compact_prompt(i: int) -> gr.Textbox:
    return gr.Textbox(label="Compaction prompt (what the model is asked when it summarises "
                            "the oldest turns; blank: the default)", lines=2, max_lines=6,
                      elem_id=f"compactprompt{i}")


def build_policy(i: int) -> gr.Radio:
    return gr.Radio([(label, key) for key, label in POLICY_LABELS.items()],
                    value="drop_oldest", elem_id=f"ctxpolicy{i}",
                    label="When the conversation no longer fits the model's context")


def gauge_html(u: ContextUsage | None) -> str:
    """`Context: 1,234 / 2,048 tokens` with a bar; amber near the limit, red over it."""
    if u is None:
        return GAUGE_EMPTY
    level = "over" if u.over else "near" if u.near else "ok"
    share = min(100.0, 100.0 * u.tokens / max(1, u.limit))
    note = ""
    if u.over and u.policy == "drop_oldest":
        note = (f" · the oldest {u.dropped} message{'s' if u.dropped != 1 else ''} will be left "
                "out of the model's context" if u.dropped else " · too long to send")
    elif u.over and u.policy == "compact":
        note = " · over the limit: sending will compact the oldest turns into a new branch"
    elif u.over:
        note = " · over the limit: sending will ask you first"
    return (f"<div class='lp-gauge lp-gauge-{level}' role='meter' aria-valuemin='0' "
            f"aria-valuenow='{u.tokens}' aria-valuemax='{u.limit}' data-tokens='{u.tokens}' "
            f"data-limit='{u.limit}' data-dropped='{u.dropped}'>"
            f"<span class='lp-gauge-bar'><span style='width:{share:.1f}%'></span></span>"
            f"<span class='lp-gauge-text'>Context: {u.tokens:,} / {u.limit:,} tokens"
            f" (reply room {u.reserve:,}){note}</span></div>")


def gauge_value(ctl: ChatController, cid: int | None, draft: str = "",
                system: str | None = None, max_tokens=None) -> str:
    """The gauge of conversation cid (empty when unknown: no model, a remote backend)."""
    if cid is None:
        return GAUGE_EMPTY
    try:
        max_tokens = int(max_tokens) if max_tokens not in (None, "") else None
        return gauge_html(ctl.context_usage(cid, draft or "", system, max_tokens))
    except USER_ERRORS:                        # a deleted conversation, an odd template
        return GAUGE_EMPTY
