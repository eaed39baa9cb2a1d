"""The cost preview's component (a line of Markdown under the Edit box) and its text, e.g.
"Reuses 1,184 tokens from the cache, prefills 37." (empty over a remote backend)."""

from __future__ import annotations

import gradio as gr


def cost_text(reused: int | None, prefill: int | None) -> str:
    if reused is None or prefill is None:
        return ""
    return f"Reuses {reused:,} tokens from the cache, prefills {prefill:,}."


def build_edit_cost(i: int) -> gr.Markdown:
    return gr.Markdown("", elem_id=f"editcost{i}", elem_classes="lp-meta")
