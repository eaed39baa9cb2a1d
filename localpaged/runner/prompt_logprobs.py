"""Prompt logprobs: the logprob (and top k) of every prompt token, as vLLM's `prompt_logprobs`.

The hidden state at position p predicts the token at p + 1, so a prefill chunk covering
positions [start, start + n) yields the logprobs of prompt tokens start + 1 .. start + n (those
still inside the prompt). The first prompt token has no logprob: its entry is None.

Invariants:
- `SequenceGroup.prompt_logprobs[q]` describes prompt token q; the list only grows, in order,
  and is complete when it holds one entry per prompt token.
- While a group's list is incomplete, its prompt is computed from position 0 (the scheduler skips
  the prefix-cache lookup for it: cached blocks would hide the logits we need), so each chunk
  starts at or before the next missing position. Positions recomputed after a preemption are
  not recorded twice.

`perplexity(llm, text)` builds on this to measure a model's quality (e.g. after quantization).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from localpaged.core.request import TokenLogprob
from localpaged.core.sampling_params import SamplingParams

ROWS_PER_SLICE = 256       # bounds the [rows, vocab] logits held at once


@dataclass
class PromptRows:
    """Which hidden rows of a step give which sequence's prompt logprobs."""
    seq_ids: list[int]         # per row: the sequence
    rows: list[int]            # per row: index into the step's flat hidden states
    targets: list[int]         # per row: the prompt token whose logprob it gives
    top_k: list[int]           # per row: how many top logprobs the request asked for


def wanted_rows(items) -> PromptRows:
    """Rows of this step's batch (items in the model runner's order) needing prompt logprobs.

    Read before the step advances `num_computed_tokens`."""
    out = PromptRows([], [], [], [])
    offset = 0
    for it in items:
        group, seq, start = it.group, it.seq, it.seq.num_computed_tokens
        if group.needs_prompt_logprobs:
            first = len(group.prompt_logprobs)           # next prompt token without a logprob
            if first < start + 1:
                raise RuntimeError(f"prompt logprobs of {group.request_id} would skip tokens "
                                   f"{first}..{start}: its prompt must be computed from 0")
            last = min(start + it.num_tokens, seq.prompt_len - 1)
            for q in range(first, last + 1):
                out.seq_ids.append(seq.seq_id)
                out.rows.append(offset + q - 1 - start)
                out.targets.append(seq.token_ids[q])
                out.top_k.append(group.params.prompt_logprobs)
        offset += it.num_tokens
    return out


def compute(model, hidden: torch.Tensor, items) -> dict[int, list[TokenLogprob]]:
    """Prompt logprobs of this step, per seq_id, in prompt order; empty when none is asked.

    `hidden` is the model's output for the whole flat batch of `items`."""
    want = wanted_rows(items)
    if not want.rows:
        return {}
    k_max = max(want.top_k)
    found: dict[int, list[TokenLogprob]] = {}
    for lo in range(0, len(want.rows), ROWS_PER_SLICE):
        hi = min(lo + ROWS_PER_SLICE, len(want.rows))
        rows = torch.tensor(want.rows[lo:hi], dtype=torch.long, device=hidden.device)
        targets = torch.tensor(want.targets[lo:hi], dtype=torch.long, device=hidden.device)
        logprobs = torch.log_softmax(model.compute_logits(hidden.index_select(0, rows)).float(), -1)
        chosen = logprobs.gather(1, targets[:, None]).squeeze(1).cpu().tolist()
        top_values, top_ids = (logprobs.topk(k_max, dim=-1) if k_max else
                               (logprobs[:, :0], logprobs[:, :0].long()))
        top_values, top_ids = top_values.cpu().tolist(), top_ids.cpu().tolist()
        for j in range(hi - lo):
            i, k = lo + j, want.top_k[lo + j]
            top = dict(zip(top_ids[j][:k], top_values[j][:k]))
            entry = TokenLogprob(want.targets[i], chosen[j], top)
            found.setdefault(want.seq_ids[i], []).append(entry)
    return found


def record(scheduled, found: dict[int, list[TokenLogprob]]) -> None:
    """Append this step's prompt logprobs to their groups (after `compute`)."""
    for it in scheduled:
        entries = found.get(it.seq.seq_id)
        if entries:
            it.group.prompt_logprobs.extend(entries)


def perplexity(llm, text: str | list[int]) -> float:
    """exp(mean negative log-likelihood) of text's tokens after the first, under llm's model.

    Text is tokenized as a prompt is (special tokens included); token ids are used as given."""
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    out = llm.generate([text], params)[0]
    lps = [e.logprob for e in out.prompt_logprobs[1:]]
    if not lps:
        raise ValueError("perplexity needs a text of at least two tokens")
    return math.exp(-sum(lps) / len(lps))
