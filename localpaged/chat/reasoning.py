"""Reasoning models: which ones mark their reasoning and how, and splitting a reply into its
reasoning and its answer, whole or as it streams. Used by the OpenAI API, the Anthropic
endpoint and the chat UI.

    fmt = reasoning_format(tokenizer)          # ReasoningFormat, or None for a model that does not
    params = SamplingParams(..., reasoning_markers=fmt.markers, reasoning_budget=1024)
    parser = fmt.parser(prompt_ids)            # starts inside when the prompt opened the reasoning
    parser.feed(delta) -> Split(reasoning, content); parser.finish() -> Split
    fmt.split(text, prompt_ids) -> Split       # the same machine over a whole reply

Two families are told apart, each found from the chat template and the tokenizer:
- "think": `<think>` ... `</think>` then the answer (Qwen3, QwQ, DeepSeek-R1 and its distills): the
  template names `</think>`, and both markers are tokens the detokenizer decodes back to their
  text (it drops special tokens, so markers it would drop cannot be split in text and the model
  is treated as plain).
- "harmony" (OpenAI's format, GPT-OSS): the reply is channel messages, `<|channel|>analysis
  <|message|>` reasoning `<|end|>`, then `<|start|>assistant<|channel|>final<|message|>` the
  answer; the template names `<|channel|>` and the tokenizer has `<|channel|>`, `<|message|>`,
  `<|end|>` and `<|start|>` as single tokens. Those are special tokens: the markers carry them
  in `ReasoningMarkers.special`, and the engine keeps them in the reply's text (and only them:
  engine/detokenizer.py `decode`), so the split below works on text for both families. A
  second analysis message joins the reasoning after a blank line; an answer written without
  reasoning (`<|channel|>final<|message|>` first) is all content. Nothing here needs GPT-OSS's
  architecture: any model the engine runs with such a tokenizer and template is split.
The closing marker is what a spent thinking budget forces (core/reasoning_budget.py): `</think>`
and "\n\n", or harmony's `<|end|><|start|>assistant<|channel|>final<|message|>`.
A template that reads `enable_thinking` (Qwen3) can switch the reasoning off (`has_switch`).

Invariants of the parser:
- Text is held back only while it may still be the start of the marker looked for next, or
  while it is whitespace that may lie right before the closing marker (dropped if so). A
  harmony reply cut short inside a marker drops that marker's start (special tokens, no text).
- The opening marker (or the format's header of a direct answer) is recognised only before any
  other text of the reply (a reply that mentions `<think>` in its answer keeps it); everything
  after the closing marker is content, its leading whitespace dropped.
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

# harmony's structural tokens and the headers of the messages a reply is made of
HARMONY_TOKENS = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>")
HARMONY_ANALYSIS = "<|channel|>analysis<|message|>"
HARMONY_FINAL = "<|channel|>final<|message|>"
HARMONY_NEXT = "<|end|><|start|>assistant"          # a message ends, the next one begins

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
    family: str = "think"            # "think" | "harmony"
    direct: str = ""                 # the header of an answer written without reasoning
    again: str = ""                  # the header of a further reasoning message (a blank line)

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
    if not isinstance(template, str):
        return None
    try:
        if HARMONY_TOKENS[0] in template:
            return _harmony(tokenizer, template)
        if THINK_CLOSE in template:
            return _think(tokenizer, template)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot say: not a reasoning model
        logger.debug("reasoning markers could not be tokenized", exc_info=True)
    return None


def _ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def _think(tokenizer, template: str) -> ReasoningFormat | None:
    ids = [_ids(tokenizer, s) for s in (THINK_OPEN, THINK_CLOSE, TRANSITION)]
    shown = [tokenizer.decode(list(i), skip_special_tokens=True) for i in ids[:2]]
    if not ids[0] or not ids[1] or shown != [THINK_OPEN, THINK_CLOSE]:
        logger.info("the chat template names %s but the detokenizer drops it: reasoning is "
                    "not split from the answer", THINK_CLOSE)
        return None
    return ReasoningFormat(THINK_OPEN, THINK_CLOSE, ReasoningMarkers(*ids),
                           has_switch="enable_thinking" in template)


def _harmony(tokenizer, template: str) -> ReasoningFormat | None:
    special = [_ids(tokenizer, s) for s in HARMONY_TOKENS]
    if any(len(i) != 1 or tokenizer.decode(list(i)) != s
           for i, s in zip(special, HARMONY_TOKENS)):
        logger.info("the chat template names %s but the tokenizer does not have harmony's "
                    "tokens: reasoning is not split from the answer", HARMONY_TOKENS[0])
        return None
    end = HARMONY_NEXT + HARMONY_FINAL
    markers = ReasoningMarkers(_ids(tokenizer, HARMONY_ANALYSIS), _ids(tokenizer, end),
                               special=tuple(i[0] for i in special))
    return ReasoningFormat(HARMONY_ANALYSIS, end, markers,
                           has_switch="enable_thinking" in template, family="harmony",
                           direct=HARMONY_FINAL, again=HARMONY_NEXT + HARMONY_ANALYSIS)


def effort_budget(effort: str) -> int:
    return EFFORT_BUDGETS[effort]


class ReasoningParser:
    """Splits one reply's text into reasoning and content as it arrives (see the module)."""

    def __init__(self, fmt: ReasoningFormat, inside: bool) -> None:
        self.fmt = fmt
        self.phase = "reasoning" if inside else "before"   # before | reasoning | after | answer
        self.buf = ""
        self.started = False            # reasoning text emitted (its leading whitespace dropped)
        self.gap = False                # a further reasoning message began: a blank line first

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
            if self.fmt.family == "harmony":     # but a marker's start: special tokens, not text
                buf = buf[:len(buf) - self._held(buf)]
            return self._reasoning(buf.rstrip())
        if self.phase == "after":
            return Split()
        return Split(content=buf)

    def _step(self) -> tuple[Split, bool]:
        """Move through the buffer once; (what goes out, whether the phase changed)."""
        f, buf = self.fmt, self.buf
        if self.phase == "before":
            head = buf.lstrip()
            for marker, phase in ((f.start, "reasoning"), (f.direct, "after")):
                if marker and head.startswith(marker):
                    self.phase, self.buf = phase, head[len(marker):]
                    return Split(), True
            if any(m.startswith(head) for m in (f.start, f.direct) if m):
                return Split(), False            # empty or a marker's start: wait
            self.phase = "answer"
            return Split(), True
        if self.phase == "reasoning":
            at, marker = _first(buf, (f.end, f.again))
            if at >= 0:
                self.buf = buf[at + len(marker):]
                out = self._reasoning(buf[:at].rstrip())
                if marker == f.end:
                    self.phase = "after"
                else:
                    self.gap = self.started
                return out, True
            # held: a partial marker at the end, and the whitespace that may precede a marker
            cut = len(buf[:len(buf) - self._held(buf)].rstrip())
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

    def _held(self, buf: str) -> int:
        """Length of the end of buf that may be the start of a marker ending the reasoning."""
        return max(_partial_suffix(buf, m) for m in (self.fmt.end, self.fmt.again) if m)

    def _reasoning(self, text: str) -> Split:
        if not self.started or self.gap:
            text = text.lstrip()
            if text and self.gap:
                text, self.gap = TRANSITION + text, False
            self.started = self.started or bool(text)
        return Split(reasoning=text)


def _first(text: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """Where the earliest of the (non-empty) markers occurs in text, and which; (-1, "")."""
    found = [(at, m) for m in markers if m and (at := text.find(m)) >= 0]
    return min(found) if found else (-1, "")


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of text that is a proper start of marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
