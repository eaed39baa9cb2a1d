"""Prompt logprobs (SamplingParams.prompt_logprobs) against log_softmax of transformers' logits.

The oracle is the HF model's own forward pass over the whole prompt: entry q of our list must
hold log_softmax(logits[q - 1])[prompt[q]] and the top k of that row. Chunked prefill, a hot
prefix cache, preemption, n > 1 and batching beside other requests must not change them, nor
change the other requests' outputs.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.engine_helpers import greedy, hf_greedy, hf_model, prompts, token_ids

from localpaged import LLM, SamplingParams
from localpaged.runner.prompt_logprobs import perplexity

ATOL = 2e-4       # fp32 engine vs fp32 transformers on the same weights


def hf_prompt_logprobs(path: str, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = hf_model(path)(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def check(path: str, prompt: list[int], got, k: int) -> None:
    ref = hf_prompt_logprobs(path, prompt)
    assert got is not None and len(got) == len(prompt) and got[0] is None
    for q in range(1, len(prompt)):
        entry, row = got[q], ref[q - 1]
        assert entry.token_id == prompt[q]
        assert entry.logprob == pytest.approx(row[prompt[q]].item(), abs=ATOL), q
        assert len(entry.top) == k
        if k:
            values, ids = row.topk(k)
            assert list(entry.top.values()) == pytest.approx(values.tolist(), abs=ATOL)
            # ids agree where the values are not near-ties
            gaps = (values[:-1] - values[1:]).tolist() + [1.0]
            for rank, (tid, gap) in enumerate(zip(ids.tolist(), gaps)):
                if gap > 10 * ATOL and (rank == 0 or gaps[rank - 1] > 10 * ATOL):
                    assert list(entry.top)[rank] == tid


def test_prompt_logprobs_equal_transformers_chunked_and_batched(tiny_llama):
    """Chunks of 7 tokens, three requests batched: two ask (k = 3 and k = 0), one does not."""
    llm = LLM(tiny_llama, num_kv_blocks=128, max_num_batched_tokens=7)
    a, b, c = prompts(3, seed=11, lo=20, hi=60)
    outs = llm.generate([a, b, c], [greedy(4, prompt_logprobs=3), greedy(4),
                                    greedy(4, prompt_logprobs=0)])
    check(tiny_llama, a, outs[0].prompt_logprobs, 3)
    assert outs[1].prompt_logprobs is None
    check(tiny_llama, c, outs[2].prompt_logprobs, 0)
    # asking changes no generated token: they are transformers' greedy tokens
    assert token_ids(outs) == [[hf_greedy(tiny_llama, p, 4)] for p in (a, b, c)]


def test_prompt_logprobs_with_hot_prefix_cache_and_n(tiny_llama):
    """The prompt's blocks are cached by an earlier request: prompt logprobs still cover every
    token (the prefix is recomputed), once per request even with n = 3."""
    llm = LLM(tiny_llama, num_kv_blocks=128, block_size=4)
    prompt = prompts(1, seed=12, lo=41, hi=42)[0]
    llm.generate([prompt], greedy(2))
    computed = llm.engine.num_tokens_computed
    sampled = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=3, prompt_logprobs=2)
    out = llm.generate([prompt], sampled)[0]
    assert llm.engine.num_tokens_computed - computed >= len(prompt)     # no prefix skipped
    check(tiny_llama, prompt, out.prompt_logprobs, 2)
    assert len(out.outputs) == 3
    # Without prompt logprobs the same prompt is a prefix hit again, with the same samples.
    again = llm.generate([prompt], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=3))[0]
    assert again.metrics.num_cached_tokens >= 40
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in out.outputs]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_prompt_logprobs_survive_preemption(tiny_llama, mode):
    """Few blocks: groups are preempted mid-way; each prompt's logprobs are still whole, once."""
    llm = LLM(tiny_llama, num_kv_blocks=12, block_size=8, preemption_mode=mode,
              max_num_batched_tokens=16, swap_space_gb=0.001)
    batch = prompts(4, seed=13, lo=20, hi=40)
    outs = llm.generate(batch, greedy(24, prompt_logprobs=1))
    stats = llm.stats()
    assert stats.num_preemptions > 0 and (mode == "recompute" or stats.num_swapped_out > 0)
    for prompt, out in zip(batch, outs):
        check(tiny_llama, prompt, out.prompt_logprobs, 1)


def test_perplexity_matches_transformers(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=64)
    prompt = prompts(1, seed=14, lo=30, hi=31)[0]
    ref = hf_prompt_logprobs(tiny_llama, prompt)
    nll = -ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].mean().item()
    assert perplexity(llm, prompt) == pytest.approx(math.exp(nll), rel=1e-4)
    with pytest.raises(ValueError, match="two tokens"):
        perplexity(llm, [5])


@pytest.mark.parametrize("bad", [-1, 21, 2.0, True])
def test_bad_prompt_logprobs(bad):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)
