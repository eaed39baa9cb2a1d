"""Requests larger than the whole KV cache: the observable contract.

- A request that outgrows the whole cache mid-decode finishes with finish_reason "length" and a
  warning naming it; the tokens it produced are exactly transformers' greedy continuation (a
  prefix of it); requests beside it give the same tokens as alone; no block stays held.
- n samples whose blocks together exceed the cache: when the group fits alone it completes (other
  groups are preempted) with outputs identical to a run with a big cache; when even alone it
  cannot hold all its samples, every sample ends with "length" as a prefix of the big-cache run.
"""

from __future__ import annotations

import logging

from helpers.engine_helpers import greedy, hf_greedy, prompts, token_ids

from localpaged import LLM, SamplingParams

BLOCK = 16


def _warned(caplog, request_id: str) -> bool:
    return any(r.levelno == logging.WARNING and request_id in r.getMessage()
               and "no longer fits in the KV cache" in r.getMessage() for r in caplog.records)


def test_request_outgrowing_the_cache_mid_decode(tiny_llama, caplog):
    long_prompt, short = prompts(1, seed=5, lo=20, hi=21)[0], prompts(3, seed=6, lo=5, hi=12)
    num_blocks = 8                                   # 128 token slots for everything
    llm = LLM(tiny_llama, num_kv_blocks=num_blocks, block_size=BLOCK)
    engine = llm.engine
    with caplog.at_level(logging.WARNING, logger="localpaged.engine.llm_engine"):
        engine.add_request("long", long_prompt, greedy(400))
        for i, p in enumerate(short):
            engine.add_request(f"short-{i}", p, greedy(10))
        final, steps = {}, 0
        while engine.has_unfinished_requests():
            steps += 1
            if steps == 60:                          # arrives while the long one fills the cache
                engine.add_request("late", short[0], greedy(10))
            for out in engine.step():
                if out.finished:
                    final[out.request_id] = out
    long_out = final["long"].outputs[0]
    assert long_out.finish_reason == "length"
    n = len(long_out.token_ids)
    # it ran until the cache (all of it) was full, then stopped: no more than the cache holds
    assert len(long_prompt) + n - 1 <= num_blocks * BLOCK
    assert n > num_blocks * BLOCK // 2 - len(long_prompt)
    assert long_out.token_ids == hf_greedy(tiny_llama, long_prompt, n)
    assert _warned(caplog, "long")
    for rid, p in [(f"short-{i}", p) for i, p in enumerate(short)] + [("late", short[0])]:
        out = final[rid].outputs[0]                  # unharmed: as transformers, in full
        assert out.finish_reason == "length" and out.token_ids == hf_greedy(tiny_llama, p, 10)
    stats = llm.stats()
    assert stats.blocks_in_use == 0 and stats.num_running == 0 and stats.num_waiting == 0
    assert stats.blocks_free + stats.blocks_cached == num_blocks


def _samples(seed: int, max_tokens: int) -> SamplingParams:
    return SamplingParams(n=4, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True)


def test_n_samples_beyond_capacity_complete_through_preemption(tiny_llama):
    batch = prompts(3, seed=41, lo=18, hi=30)
    params = [_samples(10 + i, 24) for i in range(len(batch))]
    big = token_ids(LLM(tiny_llama, num_kv_blocks=256, block_size=BLOCK).generate(batch, params))
    # each group needs at most 4 samples x ceil((30 + 24) / 16) = 16 blocks; together up to 48
    llm = LLM(tiny_llama, num_kv_blocks=16, block_size=BLOCK)
    outs = llm.generate(batch, params)
    assert token_ids(outs) == big
    assert all(c.finish_reason == "length" and len(c.token_ids) == 24
               for o in outs for c in o.outputs)
    stats = llm.stats()
    assert stats.num_preemptions > 0 and stats.blocks_in_use == 0


def test_n_samples_that_never_fit_end_with_length(tiny_llama, caplog):
    prompt = prompts(1, seed=43, lo=20, hi=21)[0]
    params = _samples(7, 40)
    big = LLM(tiny_llama, num_kv_blocks=256, block_size=BLOCK).generate([prompt], params)[0]
    llm = LLM(tiny_llama, num_kv_blocks=6, block_size=BLOCK)  # 4 x (20 + 40) tokens need > 12
    with caplog.at_level(logging.WARNING, logger="localpaged.engine.llm_engine"):
        out = llm.generate([prompt], params)[0]
    assert _warned(caplog, out.request_id)
    for cut, full in zip(out.outputs, big.outputs):
        assert cut.finish_reason == "length" and 0 < len(cut.token_ids) < 40
        assert cut.token_ids == full.token_ids[:len(cut.token_ids)]   # a prefix, never other text
    assert llm.stats().blocks_in_use == 0
