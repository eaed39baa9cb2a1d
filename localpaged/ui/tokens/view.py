"""The token view of chat tab i: a toolbar button (`tokens{i}`) and a panel (`tokpanel{i}`) that
shows the selected reply token by token, each shaded by its probability (`tokhtml{i}`). A click
on a token (TOKEN_JS, through the hidden `tokgo{i}`) lists the alternatives the model weighed
there (`tokalts{i}`); "Branch from here" (`tokbranch{i}`) starts a sibling reply with the one
picked. The HTML is made here from escaped token text and fixed class names only.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from .logic import TokenView

# Probability shades: class lp-p{k} for p in [SHADES[k], SHADES[k-1]) (lp-p0 the likeliest).
SHADES = (0.9, 0.6, 0.3, 0.1, 0.0)


@dataclass
class TokensUI:
    button: gr.Button
    panel: gr.Group
    html: gr.HTML
    at: gr.State                 # (message id, token index) of the token picked, or None
    pick: gr.Textbox             # hidden: "message id, token index" of a click (TOKEN_JS)
    go: gr.Button                # hidden: clicked by TOKEN_JS after a click on a token
    alternatives: gr.Radio
    branch: gr.Button
    close: gr.Button


def build_tokens_button(i: int) -> gr.Button:
    return gr.Button("🔍 Tokens", size="sm", elem_id=f"tokens{i}", scale=0, min_width=84)


def build_tokens_panel(i: int, button: gr.Button) -> TokensUI:
    with gr.Group(visible=False, elem_id=f"tokpanel{i}", elem_classes="lp-tokens") as panel:
        text = gr.HTML(elem_id=f"tokhtml{i}")
        alternatives = gr.Radio(label="Alternatives", choices=[], visible=False,
                                elem_id=f"tokalts{i}")
        with gr.Row(elem_classes="lp-tight"):
            branch = gr.Button("Branch from here", size="sm", variant="primary", visible=False,
                               elem_id=f"tokbranch{i}")
            close = gr.Button("Close", size="sm", elem_id=f"tokclose{i}")
        pick = gr.Textbox(visible="hidden", elem_id=f"tokpick{i}", show_label=False,
                          container=False)
        go = gr.Button(visible="hidden", elem_id=f"tokgo{i}")
    return TokensUI(button, panel, text, gr.State(None), pick, go, alternatives, branch, close)


def tokens_html(message_id: int, tokens: list[TokenView], picked: int | None = None) -> str:
    """The reply's tokens as spans in a block of class lp-m-{message id}: class lp-tok,
    lp-t-{index}, a shade by probability, and lp-picked on the picked one; each titled with its
    probability."""
    spans = []
    for t in tokens:
        shade = next(k for k, floor in enumerate(SHADES) if t.prob >= floor)
        picked_class = " lp-picked" if t.index == picked else ""
        text = html.escape(t.text) if t.text else "∅"
        spans.append(f'<span class="lp-tok lp-t-{t.index} lp-p{shade}{picked_class}" '
                     f'title="{t.prob:.1%}">{text}</span>')
    intro = ("<p class='lp-tokhelp'>Each token shaded by how likely the model found it (darker: "
             "less likely). Click one to see what else it weighed there.</p>")
    return intro + f"<div class='lp-toktext lp-m-{int(message_id)}'>{''.join(spans)}</div>"


def alternative_choices(token: TokenView) -> list[tuple[str, str]]:
    """(label, token id) of each alternative, the token itself marked."""
    out = []
    for a in token.alternatives:
        mark = "  (this reply)" if a.token_id == token.token_id else ""
        out.append((f"“{a.text}”  {a.prob:.1%}{mark}", str(a.token_id)))
    return out
