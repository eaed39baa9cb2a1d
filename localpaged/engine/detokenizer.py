"""Incremental detokenization and stop strings.

Text is decoded over a sliding window of tokens (the few before the last emitted one give the
tokenizer its context), so each step costs O(window), and an incomplete UTF-8 character
(decoded as U+FFFD) is held back until the token that completes it arrives. When the sequence
finishes (except at a stop string, which cuts the text itself), what was held back is flushed,
so the final text is exactly the tokenizer's decode of the output (an unfinished character
included, as U+FFFD).

Special tokens are left out of the text (the tokenizer's `skip_special_tokens`), but for those
a request asks to keep (`kept_special`): a reasoning model's marker tokens
(`ReasoningMarkers.special`: harmony's `<|channel|>`, `<|message|>`, `<|end|>`, `<|start|>`), so
that its reasoning can be split from its answer (chat/reasoning.py), and a tool-call family's
markers (`SamplingParams.text_special_tokens`: Mistral's `[TOOL_CALLS]`, `[ARGS]`), so that its
calls can be parsed. `decode` is that rule for any token ids (beam hypotheses, a continued reply).
"""

from __future__ import annotations

from localpaged.core.reasoning_budget import ReasoningMarkers
from localpaged.core.request import Sequence


def start_offsets(prompt_len: int) -> tuple[int, int]:
    return max(0, prompt_len - 5), prompt_len


def kept_special(params) -> tuple[int, ...]:
    """The special tokens a reply of these SamplingParams keeps in its text."""
    markers: ReasoningMarkers | None = params.reasoning_markers
    return (markers.special if markers is not None else ()) + params.text_special_tokens


def decode(tokenizer, ids: list[int], keep: tuple[int, ...] = ()) -> str:
    """The text of ids without their special tokens, but for those in `keep`: each of those is
    its own text (the runs between them are decoded apart, which equals decoding the whole
    where a special token bounds a decoder's pieces, as in byte-level BPE)."""
    if not keep or not any(t in keep for t in ids):
        return tokenizer.decode(ids, skip_special_tokens=True)
    parts: list[str] = []
    run: list[int] = []
    for t in ids:
        if t in keep:
            parts += [tokenizer.decode(run, skip_special_tokens=True), tokenizer.decode([t])]
            run = []
        else:
            run.append(t)
    return "".join(parts) + tokenizer.decode(run, skip_special_tokens=True)


def detokenize(tokenizer, seq: Sequence, final: bool = False) -> str:
    """Extend seq.text with the text of its newest tokens; returns the new text. An incomplete
    character at the end is held back unless `final` (the sequence has finished)."""
    prefix_offset, read_offset = seq.detok_state
    ids = seq.token_ids
    prefix = decode(tokenizer, ids[prefix_offset:read_offset], seq.text_special)
    full = decode(tokenizer, ids[prefix_offset:], seq.text_special)
    if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
        return ""
    new_text = full[len(prefix):]
    seq.detok_state = (read_offset, len(ids))
    seq.text += new_text
    return new_text


def find_stop(seq: Sequence, new_text: str, stops: list[str], include: bool) -> str | None:
    """If a stop string now appears in seq.text (possibly spanning tokens), cut the text there."""
    if not stops or not new_text:
        return None
    window_start = max(0, len(seq.text) - len(new_text) - max(map(len, stops)) + 1)
    best: tuple[int, str] | None = None
    for stop in stops:
        at = seq.text.find(stop, window_start)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    if best is None:
        return None
    at, stop = best
    seq.text = seq.text[:at + len(stop)] if include else seq.text[:at]
    return stop


def visible_text(seq: Sequence, stops: list[str]) -> str:
    """Text safe to stream: while running, hold back what could be the start of a stop string."""
    if seq.is_finished or not stops:
        return seq.text
    hold = max(map(len, stops)) - 1
    return seq.text[:len(seq.text) - hold] if hold else seq.text
