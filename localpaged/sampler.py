"""Sampler: from one row of logits per sampling sequence to its next token.

Each sequence samples with its own torch.Generator, so a seeded request draws the same tokens
whatever else is in the batch. Processing order follows transformers: penalties, temperature,
top-k, top-p, min-p; greedy (temperature 0) takes the argmax after penalties. Logprobs are
reported from the model's raw distribution (log-softmax of the logits), as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localpaged.request import Sequence, TokenLogprob
from localpaged.sampling_params import SamplingParams


@dataclass
class SampleResult:
    token_id: int
    logprob: float
    top: dict[int, float]


def sample(logits: torch.Tensor, seqs: list[Sequence],
           params: list[SamplingParams]) -> list[SampleResult]:
    """logits [S, V] float32, one row per sequence."""
    logprobs = torch.log_softmax(logits, dim=-1)
    results = []
    for row, seq, p in zip(logits, seqs, params):
        token = _sample_row(row, seq, p)
        results.append(SampleResult(token, float(logprobs[len(results), token]),
                                    _top(logprobs[len(results)], p.logprobs)))
    return results


def _top(row_logprobs: torch.Tensor, k: int | None) -> dict[int, float]:
    if not k:
        return {}
    values, ids = row_logprobs.topk(k)
    return dict(zip(ids.tolist(), values.tolist()))


def _sample_row(row: torch.Tensor, seq: Sequence, p: SamplingParams) -> int:
    if p.has_penalties:
        row = apply_penalties(row.clone(), seq, p)
    if p.greedy:
        return int(row.argmax())
    row = row / p.temperature
    if p.top_k and p.top_k < row.shape[0]:
        kth = row.topk(p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = row.softmax(-1)
    if p.top_p < 1.0:
        probs = _top_p(probs, p.top_p)
    if p.min_p > 0.0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    return int(torch.multinomial(probs, 1, generator=seq.generator))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    sorted_probs, order = probs.sort(descending=True)
    cumulative = sorted_probs.cumsum(-1)
    drop = cumulative - sorted_probs > top_p
    return probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))


def apply_penalties(row: torch.Tensor, seq: Sequence, p: SamplingParams) -> torch.Tensor:
    """Repetition penalty over prompt and output (as transformers); presence and frequency
    penalties over the output only (as OpenAI)."""
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
        scores = row[seen]
        row[seen] = torch.where(scores < 0, scores * p.repetition_penalty,
                                scores / p.repetition_penalty)
    output = seq.output_token_ids
    if output and (p.presence_penalty or p.frequency_penalty):
        ids, counts = torch.tensor(output, dtype=torch.long).unique(return_counts=True)
        row[ids] -= p.frequency_penalty * counts.to(row.dtype) + p.presence_penalty
    return row


def record(seq: Sequence, result: SampleResult) -> None:
    """Append a sampled token to seq with its logprobs."""
    seq.token_ids.append(result.token_id)
    seq.cumulative_logprob += result.logprob
    seq.logprobs.append(TokenLogprob(result.token_id, result.logprob, result.top))
