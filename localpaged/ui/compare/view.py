"""The compare tab's components (`CompareUI`: the target conversation, the prompt, the number of
columns, per-column settings, beam search, Think N ways and its prune margin, the summary line
above the columns, and per column its text, stats and "Continue with this") and the values its
handlers return (`CompareValues`, `ColumnsValues`, mapped to outputs by `values.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from localpaged.core.sampling_params import PruneRule

from ..settings.view import sampling_fields
from ..values import KEEP
from .logic import MAX_COLUMNS

NEW_CONVERSATION = -1
COLUMN_PRESETS = [{"temperature": 0.2}, {"temperature": 0.8}, {"temperature": 1.2},
                  {"temperature": 0.8, "top_k": 20}]


@dataclass
class CompareValues:
    """What a compare run shows; lists have one entry per column (MAX_COLUMNS)."""
    state: Any = KEEP                 # {"cid", "messages"}: what "Continue with this" picks from
    outs: Any = KEEP                  # each column's text (HTML: markdown.render)
    stats: Any = KEEP                 # each column's stats line
    picks: Any = KEEP                 # each column's "Continue with this" (interactive or not)
    prompt: Any = KEEP                # the prompt box ("" when done)
    summary: Any = KEEP               # Think N ways: the rule, what was pruned, the vote (HTML)


@dataclass
class ColumnsValues:
    """Which columns show, and whether their settings do."""
    boxes: Any = KEEP
    settings: Any = KEEP


@dataclass
class CompareUI:
    target: gr.Dropdown
    prompt: gr.Textbox
    k: gr.Radio
    own: gr.Checkbox
    beam: gr.Checkbox
    think: gr.Checkbox
    margin: gr.Number
    run: gr.Button
    stop: gr.Button
    state: gr.State
    summary: gr.HTML
    boxes: list = field(default_factory=list)         # per column: gr.Column
    settings: list = field(default_factory=list)      # per column: gr.Accordion
    fields: list = field(default_factory=list)        # per column: SAMPLING_KEYS fields
    outs: list = field(default_factory=list)
    stats: list = field(default_factory=list)
    picks: list = field(default_factory=list)


def build_compare() -> CompareUI:
    gr.Markdown("One prompt, answered side by side in **one engine batch** over the shared "
                "prompt. Continue with the column you like; the others stay as branches.",
                elem_classes="lp-muted")
    with gr.Row(equal_height=True, elem_classes="lp-compare-head"):
        target = gr.Dropdown(label="Conversation", choices=[("New conversation", NEW_CONVERSATION)],
                             value=NEW_CONVERSATION, scale=3, elem_id="cmp-target")
        k = gr.Radio([2, 3, 4], value=3, label="Columns", scale=2, min_width=200, elem_id="cmp-k")
        own = gr.Checkbox(label="Own settings per column", value=False, scale=2, elem_id="cmp-own",
                          info="Off: samples of the chat's settings")
        beam = gr.Checkbox(label="Beam search (width = columns)", value=False, scale=2,
                           elem_id="cmp-beam",
                           info="The final beams, each with its score (local engine only)")
    with gr.Row(equal_height=True, elem_classes="lp-compare-head"):
        think = gr.Checkbox(label="Think N ways (branches = columns)", value=False, scale=3,
                            elem_id="cmp-think",
                            info="Samples that fall behind are pruned as they go; a majority "
                                 "vote on short final answers (local engine only)")
        margin = gr.Number(value=PruneRule().margin, minimum=0, step=0.1, scale=2,
                           label="Prune margin (mean logprob behind the best)",
                           elem_id="cmp-margin")
    with gr.Row(equal_height=True, elem_classes="lp-composer"):
        prompt = gr.Textbox(placeholder="One prompt, answered side by side…", show_label=False,
                            lines=1, max_lines=8, scale=8, elem_id="cmp-prompt", container=False)
        run = gr.Button("Compare", variant="primary", scale=1, min_width=90, elem_id="cmp-run")
        stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id="cmp-stop")
    summary = gr.HTML("", elem_id="cmp-summary", elem_classes="lp-meta")
    ui = CompareUI(target, prompt, k, own, beam, think, margin, run, stop, gr.State(None), summary)
    with gr.Row(equal_height=False, elem_classes="lp-columns"):
        for j in range(MAX_COLUMNS):
            with gr.Column(visible=j < 3, min_width=220, elem_classes="lp-column") as box:
                gr.Markdown(f"**Column {j + 1}**")
                with gr.Accordion("Settings", open=False, visible=False) as acc:
                    ui.fields.append(sampling_fields(f"cmp{j}-", COLUMN_PRESETS[j], rows=False))
                ui.outs.append(gr.HTML("", elem_id=f"cmp-out{j}", elem_classes="lp-cmp-out",
                                       min_height=120, js_on_load=None))
                ui.stats.append(gr.Markdown("", elem_id=f"cmp-stats{j}", elem_classes="lp-meta"))
                ui.picks.append(gr.Button("Continue with this", size="sm", elem_id=f"cmp-pick{j}",
                                          interactive=False))
            ui.boxes.append(box)
            ui.settings.append(acc)
    return ui
