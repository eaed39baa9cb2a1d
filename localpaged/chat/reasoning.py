"""Reasoning models: which ones mark their reasoning and how, and splitting a reply into its
reasoning and its answer, whole or as it streams. Used by the OpenAI API, the Anthropic
endpoint and the chat UI.

    fmt = reasoning_format(tokenizer)          # ReasoningFormat, or None for a model that does not
    params = SamplingParams(..., reasoning_markers=fmt.markers, reasoning_budget=1024)
    parser = fmt.parser(prompt_ids)            # starts inside when the prompt opened the reasoning
    parser.feed(delta) -> Split(reasoning, content); parser.finish() -> Split
    fmt.split(text, prompt_ids) -> Split       # the same machine over a whole reply

The family told apart here is "think": `<think>` ... `</think>` then the answer (Qwen3, QwQ,
DeepSeek-R1 and its distills), found from the chat template (it names `</think>`) and the
tokenizer (both markers are tokens it decodes back to their text; the detokenizer drops special
tokens, so markers it would drop cannot be split in text and the model is treated as plain).
A template that reads `enable_thinking` (Qwen3) can switch the reasoning off. GPT-OSS's harmony
channels are not told apart: the engine does not run that architecture.

Invariants of the parser:
- Text is held back only while it may still be the start of the marker looked for next, or
  while it is whitespace that may lie right before the closing marker (dropped if so).
- The opening marker is recognised only before any other text of the reply (a reply that
  mentions `<think>` in its answer keeps it); everything after the closing marker is content,
  its leading whitespace dropped.
- `split(text)` equals the concatenation of what `feed` returned over any cut of the text into
  deltas, plus `finish()`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from localpaged.core.reasoning_budget import ReasoningMarkers, ReasoningState

logger = logging.getLogger(__name__)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TRANSITION = "\n\n"          # what a forced closing marker is followed by, as templates write it

# reasoning_effort (OpenAI's values) as thinking budgets, in tokens
EFFORT_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384}


@dataclass(frozen=True)
class Split:
    reasoning: str = ""
    content: str = ""

    def __add__(self, other: "Split") -> "Split":
        return Split(self.reasoning + other.reasoning, self.content + other.content)


@dataclass(frozen=True)
class ReasoningFormat:
    start: str
    end: str
    markers: ReasoningMarkers        # the markers' token ids and the forced transition's
    has_switch: bool                 # the template reads enable_thinking

    def opens_in(self, prompt_ids: list[int]) -> bool:
        """Whether the prompt leaves the reply inside the reasoning (the template opened it)."""
        state = ReasoningState.start(self.markers, None, prompt_ids)
        return bool(state and state.inside)

    def parser(self, prompt_ids: list[int] | None = None) -> "ReasoningParser":
        return ReasoningParser(self, self.opens_in(prompt_ids or []))

    def split(self, text: str, prompt_ids: list[int] | None = None) -> Split:
        p = self.parser(prompt_ids)
        return p.feed(text) + p.finish()


def reasoning_format(tokenizer) -> ReasoningFormat | None:
    """The reasoning format of a model's chat template and tokenizer, None if it marks none."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str) or THINK_CLOSE not in template:
        return None
    try:
        ids = [tuple(tokenizer.encode(s, add_special_tokens=False))
               for s in (THINK_OPEN, THINK_CLOSE, TRANSITION)]
        shown = [tokenizer.decode(list(i), skip_special_tokens=True) for i in ids[:2]]
    except Exception:  # noqa: BLE001 - a tokenizer that cannot say: not a reasoning model
        logger.debug("reasoning markers could not be tokenized", exc_info=True)
        return None
    if not ids[0] or not ids[1] or shown != [THINK_OPEN, THINK_CLOSE]:
        logger.info("the chat template names %s but the detokenizer drops it: reasoning is "
                    "not split from the answer", THINK_CLOSE)
        return None
    return ReasoningFormat(THINK_OPEN, THINK_CLOSE, ReasoningMarkers(*ids),
                           has_switch="enable_thinking" in template)


def effort_budget(effort: str) -> int:
    return EFFORT_BUDGETS[effort]


class ReasoningParser:
    """Splits one reply's text into reasoning and content as it arrives (see the module)."""

    def __init__(self, fmt: ReasoningFormat, inside: bool) -> None:
        self.fmt = fmt
        self.phase = "reasoning" if inside else "before"   # before | reasoning | after | answer
        self.buf = ""
        self.started = False            # reasoning text emitted (its leading whitespace dropped)

    def feed(self, text: str) -> Split:
        self.buf += text
        out = Split()
        while True:
            step, progressed = self._step()
            out = out + step
            if not progressed:
                return out

    def finish(self) -> Split:
        buf, self.buf = self.buf, ""
        if self.phase == "reasoning":       # never closed (cut short): all of it is reasoning
            text = buf.rstrip() if self.started else buf.strip()
            return Split(reasoning=text)
        if self.phase == "after":
            return Split()
        return Split(content=buf)

    def _step(self) -> tuple[Split, bool]:
        """Move through the buffer once; (what goes out, whether the phase changed)."""
        f, buf = self.fmt, self.buf
        if self.phase == "before":
            head = buf.lstrip()
            if head.startswith(f.start):
                self.phase, self.buf = "reasoning", head[len(f.start):]
                return Split(), True
            if f.start.startswith(head):
                return Split(), False            # empty or the opener's start: wait
            self.phase = "answer"
            return Split(), True
        if self.phase == "reasoning":
            at = buf.find(f.end)
            if at >= 0:
                self.phase, self.buf = "after", buf[at + len(f.end):]
                return self._reasoning(buf[:at].rstrip()), True
            # held: a partial closer at the end, and the whitespace that may precede a closer
            cut = len(buf[:len(buf) - _partial_suffix(buf, f.end)].rstrip())
            self.buf = buf[cut:]
            return self._reasoning(buf[:cut]), False
        if self.phase == "after":
            head = buf.lstrip()
            if not head:
                self.buf = ""
                return Split(), False
            self.phase, self.buf = "answer", head
            return Split(), True
        self.buf = ""
        return Split(content=buf), False

    def _reasoning(self, text: str) -> Split:
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        return Split(reasoning=text)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of text that is a proper start of marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
