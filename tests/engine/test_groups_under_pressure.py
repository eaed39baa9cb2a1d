"""Parallel samples and beams: reproducible, sharing blocks, and unchanged by preemption.

A cache too small for the batch forces preemption of whole groups, by recompute or by swap;
the outputs must equal those of an unpressured run, whose every sample equals the transformers
oracle (engine_helpers.hf_sampled) and whose beams equal transformers' beam search.
"""

import pytest
from helpers.engine_helpers import hf_beams, hf_expected, prompts, token_ids

from localpaged import LLM, SamplingParams


@pytest.fixture(scope="module")
def batch():
    return prompts(6, seed=31, lo=20, hi=50)


def samples(i):
    return SamplingParams(n=4, temperature=1.0, top_k=40, seed=100 + i, max_tokens=16, ignore_eos=True)


def run(path, batch, **kw):
    llm = LLM(path, **kw)
    n4 = token_ids(llm.generate(batch, [samples(i) for i in range(len(batch))]))
    beams = token_ids(llm.beam_search(batch, 4, 10, ignore_eos=True))
    return llm, n4, beams


@pytest.fixture(scope="module")
def unpressured(tiny_llama, batch):
    llm, n4, beams = run(tiny_llama, batch, num_kv_blocks=512)
    assert llm.stats().num_preemptions == 0
    assert n4 == [hf_expected(tiny_llama, p, samples(i)) for i, p in enumerate(batch)]
    assert beams == [hf_beams(tiny_llama, p, 4, 10)[0] for p in batch]
    return n4, beams


def test_seeded_parallel_samples_are_reproducible(tiny_llama, batch, unpressured):
    _, n4, beams = run(tiny_llama, batch[:2], num_kv_blocks=512, block_size=8)
    assert n4 == unpressured[0][:2] and beams == unpressured[1][:2]
    assert len({tuple(t) for t in n4[0]}) > 1                 # four different samples


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_groups_give_identical_outputs(tiny_llama, batch, unpressured, mode):
    llm, n4, beams = run(tiny_llama, batch, num_kv_blocks=20, preemption_mode=mode,
                         swap_space_gb=0.01, debug_checks=True)
    stats = llm.stats()
    assert stats.num_preemptions > 0
    if mode == "swap":
        assert stats.num_swapped_out > 0
    assert (n4, beams) == unpressured
    assert stats.blocks_in_use == 0 and stats.cpu_blocks_in_use == 0
