"""The side-by-side compare tab: one prompt, 2 to 4 columns decoded in one engine batch over
the shared prompt, each column k samples of the conversation's settings or its own settings,
or the k final beams of one beam search (width k, each with its score; local engine only);
"Continue with this" makes a column the active branch (the others stay as siblings).

Its components (`CompareUI`), the values its run handler streams (`CompareValues`, mapped to
outputs by `values.py`), the handlers and their wiring.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from . import render
from .controller import MAX_COLUMNS, ChatController
from .queues import GEN, QUICK
from .sampling import SAMPLING_KEYS, from_fields
from .sampling_fields import sampling_fields
from .tabset import Page
from .toasts import USER_ERRORS, info, warn, why
from .values import KEEP, flatten, outputs

log = logging.getLogger(__name__)

NEW_CONVERSATION = -1
COLUMN_PRESETS = [{"temperature": 0.2}, {"temperature": 0.8}, {"temperature": 1.2},
                  {"temperature": 0.8, "top_k": 20}]


@dataclass
class CompareValues:
    """What a compare run shows; lists have one entry per column (MAX_COLUMNS)."""
    state: Any = KEEP                 # {"cid", "messages"}: what "Continue with this" picks from
    outs: Any = KEEP                  # each column's text (Markdown)
    stats: Any = KEEP                 # each column's stats line
    picks: Any = KEEP                 # each column's "Continue with this" (interactive or not)
    prompt: Any = KEEP                # the prompt box ("" when done)


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
    run: gr.Button
    stop: gr.Button
    state: gr.State
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
    with gr.Row(equal_height=True, elem_classes="lp-composer"):
        prompt = gr.Textbox(placeholder="One prompt, answered side by side…", show_label=False,
                            lines=1, max_lines=8, scale=8, elem_id="cmp-prompt", container=False)
        run = gr.Button("Compare", variant="primary", scale=1, min_width=90, elem_id="cmp-run")
        stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id="cmp-stop")
    ui = CompareUI(target, prompt, k, own, beam, run, stop, gr.State(None))
    with gr.Row(equal_height=False, elem_classes="lp-columns"):
        for j in range(MAX_COLUMNS):
            with gr.Column(visible=j < 3, min_width=220, elem_classes="lp-column") as box:
                gr.Markdown(f"**Column {j + 1}**")
                with gr.Accordion("Settings", open=False, visible=False) as acc:
                    ui.fields.append(sampling_fields(f"cmp{j}-", COLUMN_PRESETS[j], rows=False))
                ui.outs.append(gr.Markdown("", elem_id=f"cmp-out{j}", elem_classes="lp-cmp-out",
                                           sanitize_html=True, min_height=120))
                ui.stats.append(gr.Markdown("", elem_id=f"cmp-stats{j}", elem_classes="lp-meta"))
                ui.picks.append(gr.Button("Continue with this", size="sm", elem_id=f"cmp-pick{j}",
                                          interactive=False))
            ui.boxes.append(box)
            ui.settings.append(acc)
    return ui


class CompareEvents:
    def __init__(self, ctl: ChatController) -> None:
        self.ctl = ctl

    def targets(self, slots: list, current: int) -> gr.Dropdown:
        """The conversations open in tabs (the current one chosen), or a new one."""
        choices = [(render.tab_label(self.ctl.conversation(c)), c) for c in slots if c is not None]
        value = slots[current] if slots and slots[current] is not None else NEW_CONVERSATION
        return gr.Dropdown(choices=choices + [("New conversation", NEW_CONVERSATION)], value=value)

    def layout(self, k: int, own: bool) -> ColumnsValues:
        return ColumnsValues(boxes=[gr.Column(visible=j < int(k)) for j in range(MAX_COLUMNS)],
                             settings=[gr.Accordion(visible=bool(own))
                                       for _ in range(MAX_COLUMNS)])

    def run(self, target: int | None, prompt: str, k: int, own: bool,
            per_column: list[tuple], beam: bool = False) -> Iterator[CompareValues]:
        """`per_column`: each column's settings field values, in SAMPLING_KEYS order; `beam`:
        the columns are the k beams of one beam search (own settings do not apply)."""
        k = int(k)
        try:
            cid = target if target not in (None, NEW_CONVERSATION) else self.ctl.new_conversation().id
            if beam:
                turn = self.ctl.compare_beams(cid, prompt or "", k)
            else:
                columns = [from_fields(per_column[j]) for j in range(k)]
                turn = self.ctl.compare(cid, prompt or "", columns if own else k)
        except USER_ERRORS as exc:
            warn(why(exc))
            yield CompareValues()
            return
        state = {"cid": cid, "messages": [r.message_id for r in turn.replies]}
        for t in turn.updates():
            if t.done and t.error:
                warn(f"Generation stopped: {t.error}")
            values = self._columns(t, k)
            values.state, values.prompt = state, "" if t.done else KEEP
            yield values

    def _columns(self, turn, k: int) -> CompareValues:
        texts, stats, picks = [], [], []
        for j in range(MAX_COLUMNS):
            if j >= k:
                texts.append(""), stats.append(""), picks.append(gr.Button(interactive=False))
                continue
            r = turn.replies[j]
            texts.append(render.escape_markdown(r.text) + (" ▌" if r.status == "streaming" else ""))
            note = render.fmt_stats(r.stats)
            if turn.beam and r.stats.get("beam_score") is not None and turn.done:
                note = f"score {float(r.stats['beam_score']):.3f} · {note}"
            status = "" if r.status in ("complete", "streaming") else f"{r.status} · "
            stats.append(f"<sub>{status}{note}</sub>" if note or status else "")
            picks.append(gr.Button(interactive=turn.done and r.status != "deleted"))
        return CompareValues(outs=texts, stats=stats, picks=picks)

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
            warn(why(exc))
            return None
        info(f"Continuing with column {j + 1}; the other columns stay as branches.")
        return state["cid"]


def wire_compare(cmp: CompareUI, tab: gr.Tab, page: Page, ev: CompareEvents) -> None:
    slots, current = page.ui.slots, page.ui.current
    n_fields = len(SAMPLING_KEYS)

    def run(target, prompt, k, own, beam, *settings) -> Iterator[list]:
        per_column = [settings[j * n_fields:(j + 1) * n_fields] for j in range(MAX_COLUMNS)]
        for v in ev.run(target, prompt, k, own, per_column, beam):
            yield flatten(cmp, v)

    def pick(j: int):
        def run_pick(state, slot_cids, cur) -> list:
            return page.ui.flatten(page.tabs.open(slot_cids, cur, ev.pick(state, j), refresh=True))
        return run_pick

    tab.select(ev.targets, [slots, current], cmp.target, **QUICK)
    for trigger in (cmp.k.change, cmp.own.change):
        trigger(lambda k, own: flatten(cmp, ev.layout(k, own)), [cmp.k, cmp.own],
                outputs(cmp, ColumnsValues))
    ran = cmp.run.click(run, [cmp.target, cmp.prompt, cmp.k, cmp.own, cmp.beam,
                              *[f for col in cmp.fields for f in col]],
                        outputs(cmp, CompareValues), **GEN)
    page.refresh_after(ran)
    ran.then(page.handler(page.tabs.refresh_chats), slots, page.ui.outputs(), **QUICK)
    cmp.stop.click(ev.stop, cmp.state, None, **QUICK)
    for j, button in enumerate(cmp.picks):
        page.refresh_after(button.click(pick(j), [cmp.state, slots, current], page.ui.outputs(),
                                        **QUICK))
