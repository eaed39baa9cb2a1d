"""The side-by-side compare tab: one prompt, 2 to 4 columns decoded in one engine batch over
the shared prompt, each column k samples of the conversation's settings or its own settings;
"Continue with this" makes a column the active branch (the others stay as siblings).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import gradio as gr

from . import render
from .controller import MAX_COLUMNS, ChatController
from .events import USER_ERRORS, _why, info, warn
from .generation import DEFAULT_SAMPLING, SAMPLING_KEYS

log = logging.getLogger(__name__)

NEW_CONVERSATION = -1
COLUMN_PRESETS = [{"temperature": 0.2}, {"temperature": 0.8}, {"temperature": 1.2},
                  {"temperature": 0.8, "top_k": 20}]


@dataclass
class Column:
    box: gr.Column
    settings: gr.Accordion
    fields: list = field(default_factory=list)     # one component per SAMPLING_KEYS
    out: gr.Markdown | None = None
    stats: gr.Markdown | None = None
    pick: gr.Button | None = None


@dataclass
class CompareUI:
    target: gr.Dropdown
    prompt: gr.Textbox
    k: gr.Radio
    own: gr.Checkbox
    run: gr.Button
    stop: gr.Button
    state: gr.State
    columns: list[Column]

    def settings_inputs(self) -> list:
        return [f for c in self.columns for f in c.fields]

    def output_boxes(self) -> list:
        return [c.out for c in self.columns] + [c.stats for c in self.columns]


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
    with gr.Row(equal_height=True, elem_classes="lp-composer"):
        prompt = gr.Textbox(placeholder="One prompt, answered side by side…", show_label=False,
                            lines=1, max_lines=8, scale=8, elem_id="cmp-prompt", container=False)
        run = gr.Button("Compare", variant="primary", scale=1, min_width=90, elem_id="cmp-run")
        stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id="cmp-stop")
    columns = []
    with gr.Row(equal_height=False, elem_classes="lp-columns"):
        for j in range(MAX_COLUMNS):
            preset = {**DEFAULT_SAMPLING, **COLUMN_PRESETS[j]}
            with gr.Column(visible=j < 3, min_width=220, elem_classes="lp-column") as box:
                gr.Markdown(f"**Column {j + 1}**")
                with gr.Accordion("Settings", open=False, visible=False) as acc:
                    fields = _setting_fields(preset, f"cmp{j}")
                out = gr.Markdown("", elem_id=f"cmp-out{j}", elem_classes="lp-cmp-out",
                                  sanitize_html=True, min_height=120)
                stats = gr.Markdown("", elem_id=f"cmp-stats{j}", elem_classes="lp-meta")
                pick = gr.Button("Continue with this", size="sm", elem_id=f"cmp-pick{j}",
                                 interactive=False)
            columns.append(Column(box, acc, fields, out, stats, pick))
    return CompareUI(target, prompt, k, own, run, stop, gr.State(None), columns)


def _setting_fields(values: dict, prefix: str) -> list:
    return [
        gr.Slider(0, 2, value=values["temperature"], step=0.05, label="Temperature",
                  elem_id=f"{prefix}-temperature"),
        gr.Slider(0.05, 1, value=values["top_p"], step=0.05, label="Top-p"),
        gr.Number(value=values["top_k"], precision=0, minimum=0, label="Top-k (0: off)"),
        gr.Slider(0, 1, value=values["min_p"], step=0.01, label="Min-p"),
        gr.Number(value=values["seed"], precision=0, label="Seed (blank: random)"),
        gr.Number(value=values["max_tokens"], precision=0, minimum=1, label="Max tokens",
                  elem_id=f"{prefix}-max_tokens"),
    ]


class CompareEvents:
    def __init__(self, ctl: ChatController) -> None:
        self.ctl = ctl

    def targets(self, slots: list, current: int) -> gr.Dropdown:
        """The conversations open in tabs (the current one chosen), or a new one."""
        choices = [(render.tab_label(self.ctl.store.get_conversation(c)), c)
                   for c in slots if c is not None]
        value = slots[current] if slots and slots[current] is not None else NEW_CONVERSATION
        return gr.Dropdown(choices=choices + [("New conversation", NEW_CONVERSATION)], value=value)

    def layout(self, k: int, own: bool) -> list:
        k = int(k)
        return ([gr.Column(visible=j < k) for j in range(MAX_COLUMNS)]
                + [gr.Accordion(visible=bool(own)) for _ in range(MAX_COLUMNS)])

    def run(self, target: int | None, prompt: str, k: int, own: bool,
            *settings) -> Iterator[list]:
        """Outputs: state, 4 texts, 4 stats lines, 4 pick buttons, prompt box."""
        k = int(k)
        try:
            cid = target if target not in (None, NEW_CONVERSATION) else self.ctl.new_conversation().id
            per_column = [dict(zip(SAMPLING_KEYS, settings[j * 6:(j + 1) * 6])) for j in range(k)]
            turn = self.ctl.compare(cid, prompt or "", per_column if own else k)
        except USER_ERRORS as exc:
            warn(_why(exc))
            yield [gr.skip()] * (1 + 3 * MAX_COLUMNS + 1)
            return
        state = {"cid": cid, "messages": [r.message_id for r in turn.replies]}
        for t in turn.updates():
            if t.done and t.error:
                warn(f"Generation stopped: {t.error}")
            yield self._columns(state, t, k) + [gr.skip() if not t.done else ""]

    def _columns(self, state: dict, turn, k: int) -> list:
        texts, stats, picks = [], [], []
        for j in range(MAX_COLUMNS):
            if j >= k:
                texts.append(""), stats.append(""), picks.append(gr.Button(interactive=False))
                continue
            r = turn.replies[j]
            texts.append(render.escape_markdown(r.text) + (" ▌" if r.status == "streaming" else ""))
            note = render.fmt_stats(r.stats)
            status = "" if r.status in ("complete", "streaming") else f"{r.status} · "
            stats.append(f"<sub>{status}{note}</sub>" if note or status else "")
            picks.append(gr.Button(interactive=turn.done and r.status != "deleted"))
        return [state] + texts + stats + picks

    def stop(self, state: dict | None) -> None:
        if state:
            self.ctl.stop(state["cid"])

    def pick(self, state: dict | None, j: int) -> int | None:
        """Make column j the active branch; returns the conversation to show."""
        if not state or j >= len(state["messages"]):
            return None
        try:
            self.ctl.pick(state["messages"][j])
        except USER_ERRORS as exc:
            warn(_why(exc))
            return None
        info(f"Continuing with column {j + 1}; the other columns stay as branches.")
        return state["cid"]
