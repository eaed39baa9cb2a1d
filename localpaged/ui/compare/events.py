"""The compare tab's handlers and wiring: one prompt, 2 to 4 columns decoded in one engine batch
over the shared prompt, each column k samples of the conversation's settings or its own
settings, the k final beams of one beam search (width k, each with its score; local engine
only), or Think N ways (k samples pruned as they fall behind, a majority vote of the survivors'
short answers; local engine only); "Continue with this" makes a column the active branch (the
others stay as siblings).
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr

from .. import markdown, render
from localpaged.core.sampling_params import PruneRule

from ..controller import ChatController
from ..event_settings import GEN, QUICK
from ..settings.logic import SAMPLING_KEYS, from_fields
from ..tabs.events import Page
from ..toasts import USER_ERRORS, info, warn, why
from ..values import KEEP, flatten, outputs
from .logic import MAX_COLUMNS
from .vote import Vote, vote
from .view import NEW_CONVERSATION, ColumnsValues, CompareUI, CompareValues


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
            per_column: list[tuple], beam: bool = False, think: bool = False,
            margin: float | None = None) -> Iterator[CompareValues]:
        """`per_column`: each column's settings field values, in SAMPLING_KEYS order; `beam`:
        the columns are the k beams of one beam search (own settings do not apply); `think`:
        k samples pruned by a rule with this `margin` (Think N ways)."""
        k = int(k)
        rule = None
        try:
            if think:
                rule = PruneRule(margin=float(PruneRule().margin if margin is None else margin))
            cid = target if target not in (None, NEW_CONVERSATION) else self.ctl.new_conversation().id
            if think:
                turn = self.ctl.think(cid, prompt or "", k, rule)
            elif beam:
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
            values.summary = ""
            if rule is not None:
                outcome = think_outcome(t)
                values.summary = think_summary(t, rule, outcome)
                if t.done:
                    self._continue_with_winner(outcome)
            yield values

    def _continue_with_winner(self, outcome: ThinkOutcome) -> None:
        """Think N ways' active branch once done: the first branch that gave the majority's
        answer, else the first that was not pruned (a pruned one stays a sibling)."""
        if not outcome.survivors:
            return
        v = outcome.vote
        chosen = outcome.survivors[v.columns[0]] if v is not None else outcome.survivors[0]
        try:
            self.ctl.pick(chosen.message_id)
        except USER_ERRORS as exc:
            warn(why(exc))

    def _columns(self, turn, k: int) -> CompareValues:
        texts, stats, picks = [], [], []
        for j in range(MAX_COLUMNS):
            if j >= k:
                texts.append(""), stats.append(""), picks.append(gr.Button(interactive=False))
                continue
            r = turn.replies[j]
            texts.append(markdown.render(r.text + (render.CURSOR if r.status == "streaming" else "")))
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


@dataclass
class ThinkOutcome:
    survivors: list                  # the replies not pruned (nor deleted), in column order
    vote: Vote | None                # their majority answer, once the turn is done


def think_outcome(turn) -> ThinkOutcome:
    survivors = [r for r in turn.replies if "pruned" not in r.stats and r.status != "deleted"]
    return ThinkOutcome(survivors, vote([r.text for r in survivors]) if turn.done else None)


def think_summary(turn, rule: PruneRule, outcome: ThinkOutcome | None = None) -> str:
    """The line above Think N ways' columns (HTML, model text escaped): the rule, each pruned
    branch and what it gave back, and once done the majority vote of the survivors."""
    outcome = outcome or think_outcome(turn)
    lines = [f"<b>Think {len(turn.replies)} ways</b> · {html.escape(rule.describe())}"]
    for j, r in enumerate(turn.replies):
        pruned = r.stats.get("pruned")
        if pruned:
            freed = r.stats.get("released_blocks")
            lines.append(f"Branch {j + 1} pruned at token {int(pruned['at'])}"
                         + (f", gave back {int(freed)} KV blocks" if freed else ""))
    if turn.done:
        v = outcome.vote
        lines.append("No short final answers to vote on." if v is None else
                     f"Majority vote: <b>{html.escape(v.answer)}</b> ({v.count} of {v.voters} "
                     f"branches with a short answer)")
    return "<br>".join(lines)


def wire_compare(cmp: CompareUI, tab: gr.Tab, page: Page, ev: CompareEvents) -> None:
    slots, current = page.ui.slots, page.ui.current
    n_fields = len(SAMPLING_KEYS)

    def run(target, prompt, k, own, beam, think, margin, *settings) -> Iterator[list]:
        per_column = [settings[j * n_fields:(j + 1) * n_fields] for j in range(MAX_COLUMNS)]
        for v in ev.run(target, prompt, k, own, per_column, beam, think, margin):
            yield flatten(cmp, v)

    def pick(j: int):
        def run_pick(state, slot_cids, cur) -> list:
            return page.ui.flatten(page.tabs.open(slot_cids, cur, ev.pick(state, j), refresh=True))
        return run_pick

    tab.select(ev.targets, [slots, current], cmp.target, **QUICK)
    for trigger in (cmp.k.change, cmp.own.change):
        trigger(lambda k, own: flatten(cmp, ev.layout(k, own)), [cmp.k, cmp.own],
                outputs(cmp, ColumnsValues), **QUICK)
    ran = cmp.run.click(run, [cmp.target, cmp.prompt, cmp.k, cmp.own, cmp.beam, cmp.think,
                              cmp.margin,
                              *[f for col in cmp.fields for f in col]],
                        outputs(cmp, CompareValues), **GEN)
    page.refresh_after(ran)
    ran.then(page.handler(page.tabs.refresh_chats), slots, page.ui.outputs(), **QUICK)
    cmp.stop.click(ev.stop, cmp.state, None, **QUICK)
    for j, button in enumerate(cmp.picks):
        page.refresh_after(button.click(pick(j), [cmp.state, slots, current], page.ui.outputs(),
                                        **QUICK))
