"""The result of a request does not depend on what ran beside it (docs/architecture.md §2, I12).

Batching, prefix hits, block size, chunked prefill and preemption change speed and memory,
never tokens: greedy, and seeded sampling. Every row run alone is anchored to transformers first
(greedy: `hf_greedy`; seeded sampling: `hf_sampled`, the same filters and draws computed from
transformers' logits), so "the same as alone" is "the same as transformers" for every row.
"""

import pytest
from helpers.engine_helpers import greedy, hf_greedy, hf_sampled, prompts, token_ids

from localpaged import LLM, SamplingParams

N_NEW = 24


@pytest.fixture(scope="module")
def batch():
    return prompts(16, seed=7)


@pytest.fixture(scope="module")
def alone(tiny_llama, batch):
    """Each prompt run on its own, greedy; every row equals transformers' generate."""
    llm = LLM(tiny_llama, num_kv_blocks=64, enable_prefix_caching=False)
    outs = token_ids([llm.generate([p], greedy(N_NEW))[0] for p in batch])
    assert outs == [[hf_greedy(tiny_llama, p, N_NEW)] for p in batch]
    return outs


SAMPLED = dict(temperature=0.9, top_p=0.95, top_k=50)


def sampled(seed):
    return SamplingParams(**SAMPLED, seed=seed, max_tokens=N_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def alone_sampled(tiny_llama, batch):
    """Each prompt run on its own, seeded sampling; every row equals the transformers oracle."""
    llm = LLM(tiny_llama, num_kv_blocks=64, enable_prefix_caching=False)
    outs = token_ids([llm.generate([p], sampled(i))[0] for i, p in enumerate(batch)])
    assert outs == [[hf_sampled(tiny_llama, p, N_NEW, seed=i, **SAMPLED)[0]]
                    for i, p in enumerate(batch)]
    return outs


def run_all(path, batch, **kw):
    llm = LLM(path, **kw)
    greedy_out = token_ids(llm.generate(batch, greedy(N_NEW)))
    sampled_out = token_ids(llm.generate(batch, [sampled(i) for i in range(len(batch))]))
    return llm, greedy_out, sampled_out


def test_sixteen_at_once(tiny_llama, batch, alone, alone_sampled):
    llm, g, s = run_all(tiny_llama, batch, num_kv_blocks=256)
    assert g == alone and s == alone_sampled
    assert llm.stats().blocks_in_use == 0


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_block_sizes(tiny_llama, batch, alone, alone_sampled, block_size):
    llm, g, s = run_all(tiny_llama, batch, num_kv_blocks=4096 // block_size, block_size=block_size)
    assert g == alone and s == alone_sampled


def test_prefix_cache_hot_and_cold(tiny_llama, batch, alone):
    llm = LLM(tiny_llama, num_kv_blocks=256)
    cold = token_ids(llm.generate(batch, greedy(N_NEW)))
    hits_before = llm.stats().prefix_cache_hits
    hot = token_ids(llm.generate(batch, greedy(N_NEW)))
    assert cold == alone and hot == alone
    assert llm.stats().prefix_cache_hits > hits_before


def test_chunked_prefill(tiny_llama, batch, alone, alone_sampled):
    llm, g, s = run_all(tiny_llama, batch, num_kv_blocks=256, max_num_batched_tokens=7,
                        debug_checks=True)
    assert g == alone and s == alone_sampled


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption(tiny_llama, batch, alone, alone_sampled, mode):
    llm, g, s = run_all(tiny_llama, batch, num_kv_blocks=14, preemption_mode=mode,
                        swap_space_gb=0.001, debug_checks=True)
    stats = llm.stats()
    assert stats.num_preemptions > 0
    if mode == "swap":
        assert stats.num_swapped_out > 0
    assert g == alone and s == alone_sampled
    assert stats.blocks_in_use == 0 and stats.cpu_blocks_in_use == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_with_the_disk_tier(tiny_llama, batch, alone, alone_sampled, mode, tmp_path):
    """The same pressure with the KV disk tier on: evicted blocks are written to disk and read
    back by later lookups (the second pass), and still no token changes, the block invariants
    hold after every step (debug_checks) and no block is left held in memory or on the CPU."""
    llm, g, s = run_all(tiny_llama, batch, num_kv_blocks=14, preemption_mode=mode,
                        swap_space_gb=0.001, debug_checks=True, kv_disk_dir=str(tmp_path))
    assert g == alone and s == alone_sampled
    llm.engine.kv_disk.flush()
    assert llm.stats().kv_disk.num_blocks > 0
    again = token_ids(llm.generate(batch, greedy(N_NEW)))
    stats = llm.stats()
    assert again == alone and stats.num_preemptions > 0 and stats.prefix_cache_disk_hits > 0
    if mode == "swap":
        assert stats.num_swapped_out > 0
    assert stats.blocks_in_use == 0 and stats.cpu_blocks_in_use == 0
