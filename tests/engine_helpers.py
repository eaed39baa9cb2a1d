"""Shared helpers for engine tests: greedy references from transformers, token extraction."""

from __future__ import annotations

import functools

import torch
from transformers import AutoModelForCausalLM

from localpaged import SamplingParams


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


def greedy(max_tokens: int = 32, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def token_ids(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


def prompts(n: int, seed: int = 0, vocab: int = 512, lo: int = 3, hi: int = 90) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [[1] + torch.randint(3, vocab, (L - 1,), generator=g).tolist() for L in lens]
