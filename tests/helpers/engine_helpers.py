"""Shared helpers for engine tests: greedy and sampled references from transformers, token
extraction."""

from __future__ import annotations

import functools
from collections import Counter

import torch
from transformers import AutoModelForCausalLM

from localpaged import SamplingParams
from localpaged.core.request import make_generator


@functools.lru_cache(maxsize=8)
def hf_model(path: str):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(path: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy continuation, ignoring EOS (as ignore_eos=True does)."""
    with torch.inference_mode():
        out = hf_model(path).generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                      min_new_tokens=max_new_tokens, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def penalized(raw: torch.Tensor, prompt: list[int], ids: list[int], repetition: float = 1.0,
              presence: float = 0.0, frequency: float = 0.0) -> torch.Tensor:
    """Next-token scores after the penalties, as their definitions say: repetition (transformers'
    RepetitionPenaltyLogitsProcessor) over prompt and output `ids`, presence and frequency
    (OpenAI's) over the output `ids[len(prompt):]` only."""
    scores = raw.clone()
    for t in set(ids):
        scores[t] = scores[t] * repetition if scores[t] < 0 else scores[t] / repetition
    for t, count in Counter(ids[len(prompt):]).items():
        scores[t] -= frequency * count + presence
    return scores


def hf_sampled(path: str, prompt: list[int], max_new_tokens: int, *, seed: int, index: int = 0,
               temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
               repetition: float = 1.0, presence: float = 0.0,
               frequency: float = 0.0) -> tuple[list[int], list[float]]:
    """A seeded sampled continuation from transformers' logits (its model and KV cache, no engine
    code), ignoring EOS: at every step the penalties apply (`penalized`), then temperature, top-k, top-p (the smallest set of most likely tokens whose
    mass reaches top_p) and min-p (probability >= min_p * the top one), each by its definition,
    and the token is an inverse-CDF draw at the uniform number that sample `index` of a request
    with this seed draws at that step (make_generator(seed, index), one number per step: the
    engine's seeding contract, the only engine code used). Temperature 0 is the argmax after the
    penalties. Returns (tokens, their logprobs as log_softmax of the raw logits)."""
    model, ids, chosen, cache, fresh = hf_model(path), list(prompt), [], None, list(prompt)
    generator = make_generator(seed, index)
    for _ in range(max_new_tokens):
        with torch.inference_mode():
            out = model(torch.tensor([fresh]), cache=cache, use_cache=True)
        cache, raw = out.cache, out.logits[0, -1].double()
        scores = penalized(raw, prompt, ids, repetition, presence, frequency)
        if temperature == 0:
            token = int(scores.argmax())
        else:
            z = scores / temperature
            if 0 < top_k < len(z):
                z = z.masked_fill(z < z.topk(top_k).values[-1], float("-inf"))
            probs = z.softmax(-1)
            if top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                before = sorted_probs.cumsum(0) - sorted_probs     # mass of the likelier ones
                probs = torch.zeros_like(probs).scatter_(0, order[before < top_p],
                                                         sorted_probs[before < top_p])
            if min_p > 0:
                probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
            cdf = probs.cumsum(0)
            u = float(torch.rand(1, generator=generator)) * float(cdf[-1])
            token = int((cdf <= u).sum())                         # the first index with cdf > u
        chosen.append(float(torch.log_softmax(raw, -1)[token]))
        ids.append(token)
        fresh = [token]
    return ids[len(prompt):], chosen


def hf_expected(path: str, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    """The token ids transformers' oracles give for a request ignoring EOS: `hf_greedy`, or
    `hf_sampled` for each of its n seeded samples."""
    assert params.ignore_eos and (params.greedy or params.seed is not None)
    if params.greedy and not params.has_penalties:
        return [hf_greedy(path, prompt, params.max_tokens)] * params.n
    return [hf_sampled(path, prompt, params.max_tokens, seed=params.seed, index=i,
                       temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                       min_p=params.min_p, repetition=params.repetition_penalty,
                       presence=params.presence_penalty, frequency=params.frequency_penalty)[0]
            for i in range(params.n)]


def hf_beams(path: str, prompt: list[int], width: int, max_tokens: int, length_penalty: float = 1.0,
             early_stopping: bool | str = False) -> tuple[list[list[int]], list[float]]:
    """transformers' beam search ignoring EOS: the width final beams and their scores."""
    with torch.inference_mode():
        out = hf_model(path).generate(
            torch.tensor([prompt]), num_beams=width, num_return_sequences=width, do_sample=False,
            max_new_tokens=max_tokens, length_penalty=length_penalty, early_stopping=early_stopping,
            eos_token_id=None, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    return [s[len(prompt):].tolist() for s in out.sequences], out.sequences_scores.tolist()


def greedy(max_tokens: int = 32, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def token_ids(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


def prompts(n: int, seed: int = 0, vocab: int = 512, lo: int = 3, hi: int = 90) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [[1] + torch.randint(3, vocab, (L - 1,), generator=g).tolist() for L in lens]
