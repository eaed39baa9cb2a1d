"""Sampler: from one row of logits per sampling sequence to its next token.

Each sequence samples with its own torch.Generator, so a seeded request draws the same tokens
whatever else is in the batch. Processing order follows transformers: penalties, temperature,
top-k, top-p, min-p; greedy (temperature 0) takes the argmax after penalties. Logprobs are
reported from the model's raw distribution (log-softmax of the logits), as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localpaged.core.request import Sequence, TokenLogprob
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.grammar import apply_mask


@dataclass
class SampleResult:
    token_id: int
    logprob: float
    top: dict[int, float]


def sample(logits: torch.Tensor, seqs: list[Sequence], params: list[SamplingParams],
           allowed: torch.Tensor | None = None) -> list[SampleResult]:
    """logits [S, V] float32, one row per sequence; the rows are processed as one batch.
    `allowed` [S, W] packed: the tokens each row may take (grammar masks), applied in place
    after the penalties and before every sampling rule, so greedy and every filter choose
    among them."""
    logprobs = torch.log_softmax(logits, dim=-1)
    if any(p.has_penalties for p in params):
        logits = logits.clone()
        for i, (seq, p) in enumerate(zip(seqs, params)):
            if p.has_penalties:
                apply_penalties(logits[i], seq, p)
    if allowed is not None:
        logits = apply_mask(logits, allowed)
    tokens = logits.argmax(dim=-1)
    rand = [i for i, p in enumerate(params) if not p.greedy]
    if rand:
        probs = _filtered_probs(logits[rand], [params[i] for i in rand])
        tokens[rand] = _draw(probs, [seqs[i].generator for i in rand])
    return [SampleResult(int(t), float(logprobs[i, t]), _top(logprobs[i], p.logprobs))
            for i, (t, p) in enumerate(zip(tokens.tolist(), params))]


def verify(logits: torch.Tensor, seq: Sequence, p: SamplingParams, draft: list[int],
           allowed: torch.Tensor | None = None) -> list[SampleResult]:
    """The tokens a sequence keeps from a draft of d tokens, given the logits [d + 1, V] at its
    input token and at each draft token: the accepted drafts, then one token of its own (the
    correction of the first rejected draft, or one more after them all).

    Greedy: a draft token is accepted while it is the argmax, so the tokens are exactly those
    of decoding one at a time. Sampling: at each position the token is drawn as `sample` draws
    it (one uniform number from the sequence's generator, inverse CDF of the request's
    filtered distribution p), and the draft token x is accepted when the draw is x. That is
    the rejection rule of speculative sampling for a draft that is a point mass (accepted with
    probability p(x); on a rejection the token has p without x, renormalized), and since it
    takes one number per kept token from the same stream, a seeded request keeps exactly the
    tokens it would decode one at a time. Logprobs as in `sample`: the raw distribution at
    each position. Requests with penalties are not drafted (speculation.eligible): their
    distribution at a position depends on the tokens before it. `allowed` [d + 1, W] packed: the
    grammar's mask at each position (engine/grammar.py: draft_masks), as `sample` applies it.
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    if allowed is not None:
        logits = apply_mask(logits, allowed)
    if p.greedy:
        target = logits.argmax(dim=-1).tolist()
        accepted = next((j for j, t in enumerate(draft) if target[j] != t), len(draft))
        chosen = target[:accepted + 1]
    else:
        chosen = _draw_until_rejected(_filtered_probs(logits, [p] * len(logits)), draft,
                                      seq.generator)
    return [SampleResult(t, float(logprobs[j, t]), _top(logprobs[j], p.logprobs))
            for j, t in enumerate(chosen)]


def _draw_until_rejected(probs: torch.Tensor, draft: list[int],
                         generator: torch.Generator | None) -> list[int]:
    """One draw per position (as `sample`'s), up to the first that is not the draft token."""
    chosen: list[int] = []
    for j in range(len(probs)):
        chosen.append(int(_draw(probs[j:j + 1], [generator])[0]))
        if j == len(draft) or chosen[-1] != draft[j]:
            break
    return chosen


def _top(row_logprobs: torch.Tensor, k: int | None) -> dict[int, float]:
    if not k:
        return {}
    values, ids = row_logprobs.topk(k)
    return dict(zip(ids.tolist(), values.tolist()))


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p, each row with its own values."""
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype)
    logits = logits / temperature[:, None]
    vocab = logits.shape[1]
    top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(top_k):
        kth = logits.topk(max(top_k), dim=-1).values
        k_index = torch.tensor([max(k, 1) - 1 for k in top_k])
        threshold = kth.gather(1, k_index[:, None])
        threshold[torch.tensor(top_k) == 0] = float("-inf")
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    probs = logits.softmax(dim=-1)
    top_p = torch.tensor([p.top_p for p in params], dtype=probs.dtype)
    if bool((top_p < 1.0).any()):
        probs = _top_p(probs, top_p)
    min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype)
    if bool((min_p > 0).any()):
        probs = probs.masked_fill(probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)
    return probs


def _top_p(probs: torch.Tensor, top_p: torch.Tensor, candidates: int = 1024) -> torch.Tensor:
    """Keep each row's smallest set of most likely tokens whose mass reaches top_p (at least one).

    The kept set almost always lies within the few most likely tokens: sort only those when
    their mass already reaches top_p in every row (same result), the whole row otherwise.
    """
    k = min(candidates, probs.shape[-1])
    sorted_probs, order = probs.topk(k, dim=-1)
    if not bool((sorted_probs.sum(dim=-1) >= top_p).all()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
    drop = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p[:, None]
    kept = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, kept)


def _draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """An exact draw per row by inverse CDF: one uniform number from each row's own generator."""
    cdf = probs.cumsum(dim=-1)
    u = torch.cat([torch.rand(1, generator=g) for g in generators]) * cdf[:, -1]
    return torch.searchsorted(cdf, u[:, None], right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


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
    """Append a sampled token to seq with its logprobs (its grammar and reasoning advance)."""
    seq.keep(result.token_id)
    seq.cumulative_logprob += result.logprob
    seq.logprobs.append(TokenLogprob(result.token_id, result.logprob, result.top))
