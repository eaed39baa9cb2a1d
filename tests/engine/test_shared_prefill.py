"""Prompts that arrive together and begin alike compute their common blocks once
(core.shared_prefill): the later one waits while the earlier one's prefill computes them, then
finds them in the prefix cache. Outputs equal those of each prompt alone (and so transformers',
tests/engine/test_hf_equality.py), with chunked prefill and under preemption too."""

import pytest
from helpers.engine_helpers import greedy, hf_expected, prompts, token_ids

from localpaged import LLM
from localpaged.core.config import EngineConfig
from localpaged.core.sampling_params import BACKGROUND
from localpaged.engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def batch():
    """Two prompts sharing 200 tokens (12 full blocks), a third unrelated, a fourth sharing
    only the first block with the first two (below core.shared_prefill.MIN_SHARED_BLOCKS)."""
    prefix = prompts(1, seed=3, lo=200, hi=201)[0]
    other = prompts(1, seed=4, lo=50, hi=51)[0]
    return [prefix + [10, 11, 12], prefix + [20, 21], other, prefix[:20] + [30, 31, 32]]


@pytest.fixture(scope="module")
def alone(tiny_llama):
    """(prompts, steps) -> each prompt's greedy tokens on an engine with nothing else in it;
    each prompt and length computed once for the module."""
    done: dict[tuple, list[int]] = {}

    def run(batch, steps=8):
        for p in batch:
            if (tuple(p), steps) not in done:
                llm = LLM(tiny_llama, num_kv_blocks=128)
                done[tuple(p), steps] = token_ids(llm.generate([p], greedy(steps)))[0]
        return [done[tuple(p), steps] for p in batch]
    return run


def test_prompts_sent_together_compute_their_common_blocks_once(tiny_llama, batch, alone):
    llm = LLM(tiny_llama, num_kv_blocks=128, debug_checks=True)
    eng = llm.engine
    for i, p in enumerate(batch):
        eng.add_request(f"r{i}", p, greedy(8))
    eng.step()
    first = {g.request_id for g in eng.scheduler.running}
    assert first == {"r0", "r2", "r3"}      # the unrelated prompts do not wait behind r1
    outs = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                outs[out.request_id] = out
    got = [outs[f"r{i}"] for i in range(len(batch))]
    assert got[1].metrics.num_cached_tokens == 192
    assert [o.metrics.num_cached_tokens for o in (got[0], got[2], got[3])] == [0, 0, 0]
    assert eng.num_tokens_computed == sum(len(p) for p in batch) - 192 + 7 * len(batch)
    assert eng.scheduler.num_shared_prefill_waits == 1
    assert token_ids(got) == alone(batch)
    assert token_ids(got)[0] == hf_expected(tiny_llama, batch[0], greedy(8))


def test_chunked_prefill_keeps_the_later_prompt_waiting_until_every_common_block_is_in(
        tiny_llama, batch, alone):
    """A budget of 150 tokens: the first prompt's first chunk fills step 1; in step 2 its last
    53 tokens leave room, but blocks 9-11 of the common 12 are still being computed."""
    llm = LLM(tiny_llama, num_kv_blocks=128, max_num_batched_tokens=150, debug_checks=True)
    got = llm.generate(batch[:2], greedy(8))
    assert got[1].metrics.num_cached_tokens == 192
    assert llm.engine.num_tokens_computed == len(batch[0]) + len(batch[1]) - 192 + 7 * 2
    assert llm.engine.scheduler.num_shared_prefill_waits == 1
    assert token_ids(got) == alone(batch[:2])


def test_without_the_prefix_cache_nothing_waits(tiny_llama, batch, alone):
    llm = LLM(tiny_llama, num_kv_blocks=128, enable_prefix_caching=False)
    got = llm.generate(batch, greedy(8))
    assert llm.engine.scheduler.num_shared_prefill_waits == 0
    assert llm.engine.num_tokens_computed == sum(len(p) for p in batch) + 7 * len(batch)
    assert token_ids(got) == alone(batch)


def test_prompt_logprobs_never_wait(tiny_llama, batch):
    llm = LLM(tiny_llama, num_kv_blocks=128)
    got = llm.generate(batch[:2], [greedy(4), greedy(4, prompt_logprobs=1)])
    assert llm.engine.scheduler.num_shared_prefill_waits == 0
    assert got[1].metrics.num_cached_tokens == 0 and len(got[1].prompt_logprobs) == len(batch[1])


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_sharing_prompts_under_preemption_give_the_same_tokens(tiny_llama, mode, alone):
    """Eight prompts in four pairs that share their first 100 tokens, in a cache that holds
    a few: groups are preempted while others wait on their blocks; nothing is lost or changed."""
    heads = prompts(4, seed=41, lo=100, hi=101)
    tails = prompts(8, seed=42, lo=5, hi=30)
    batch = [heads[i // 2] + tails[i] for i in range(8)]
    llm = LLM(tiny_llama, num_kv_blocks=30, max_num_batched_tokens=160, preemption_mode=mode,
              swap_space_gb=0.01, debug_checks=True)
    got = token_ids(llm.generate(batch, greedy(24)))
    stats = llm.stats()
    assert stats.num_preemptions > 0 and llm.engine.scheduler.num_shared_prefill_waits > 0
    assert got == alone(batch, steps=24)
    assert stats.blocks_in_use == 0


def test_an_interactive_prompt_never_waits_on_background_work(tiny_llama, batch):
    """Background work runs only on capacity interactive work leaves ("idle"): an interactive
    prompt that begins like a background prompt still being prefilled is admitted at once
    (and computes the common blocks past what the background one has cached)."""
    eng = LLMEngine(EngineConfig(model=tiny_llama, num_kv_blocks=128, max_num_batched_tokens=64,
                                 background_batch="idle", debug_checks=True))
    eng.add_request("bg", batch[0], greedy(4), priority=BACKGROUND)
    eng.step()                                     # the background prompt's first chunk
    eng.add_request("chat", batch[1], greedy(4))
    eng.step()
    assert [g.request_id for g in eng.scheduler.running] == ["bg", "chat"]
    assert eng.groups["chat"].seqs[0].num_computed_tokens == 128     # 64 cached, 64 computed
    assert eng.scheduler.num_shared_prefill_waits == 0


def test_background_prompts_share_their_prefill_too(tiny_llama, batch, alone):
    eng = LLMEngine(EngineConfig(model=tiny_llama, num_kv_blocks=128, max_num_batched_tokens=250,
                                 debug_checks=True))
    for rid, prompt in (("bg", batch[0]), ("bg2", batch[1])):
        eng.add_request(rid, prompt, greedy(4), priority=BACKGROUND)
    outs = {}
    while eng.has_unfinished_requests():
        outs.update({o.request_id: o for o in eng.step() if o.finished})
    assert eng.scheduler.num_shared_prefill_waits == 1
    assert outs["bg2"].metrics.num_cached_tokens == 192
    assert token_ids([outs["bg"], outs["bg2"]]) == alone(batch[:2], steps=4)
