"""Sliding-window layers in their own block tables (core.hybrid_kv_cache_manager,
core.sliding_window): blocks that fall out of a window are given back, and outputs still equal
transformers' token for token under batching, prefix hits, preemption (recompute and swap),
n > 1, beams and speculation, with every block invariant checked after every step."""

import json
import shutil

import pytest
from helpers import tiny_models
import torch
from helpers.engine_helpers import greedy, hf_beams, hf_expected, hf_greedy, hf_model, prompts
from localpaged.ui import engine_panel as kvmap
from transformers import AutoConfig

from localpaged import LLM, SamplingParams
from localpaged.core.block_pool import NULL_BLOCK
from localpaged.core.hybrid_kv_cache_manager import HybridKVCacheManager
from localpaged.core.kv_cache_manager import KVCacheManager
from localpaged.core.request import Sequence
from localpaged.engine import kv_sizing
from localpaged.models.layer_types import kv_groups

MIXED, SLIDING = "qwen2-sliding", "mistral-sliding"     # full + sliding; every layer sliding


def SAMPLED(max_tokens: int, n: int = 1) -> SamplingParams:
    """Seeded sampling: far more sensitive to the logits than greedy decoding of a tiny random
    model (which soon repeats itself)."""
    return SamplingParams(n=n, temperature=0.5, seed=3, max_tokens=max_tokens, ignore_eos=True)


def window_of(path: str) -> int:
    return AutoConfig.from_pretrained(path).sliding_window


def long_prompts(n: int, window: int, seed: int = 0) -> list[list[int]]:
    """Prompts of about 3x the window."""
    return prompts(n, seed=seed, lo=3 * window - 8, hi=3 * window + 8)


def run(llm: LLM, batch: list[list[int]], params) -> tuple[list, list]:
    """Every request added at once, stepped to the end; (outputs in order, stats of each step)."""
    engine, finals, seen = llm.engine, {}, []
    params = params if isinstance(params, list) else [params] * len(batch)
    ids = [engine.add_request(None, p, sp) for p, sp in zip(batch, params)]
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        seen.append(llm.stats())
    return [finals[i] for i in ids], seen


# ---- the block manager alone -------------------------------------------------------------------
def test_blocks_out_of_the_window_are_given_back_and_stay_cached():
    kv = HybridKVCacheManager((0, 6), [32, 32], block_size=4)
    seq = Sequence(list(range(30)), 30, 0, None)
    assert kv.admit([seq], 30) == [0]
    seq.num_computed_tokens = 30
    kv.cache_full_blocks(seq)
    full, sliding = kv.groups
    # the next query is at 30: it reads 25..30, so blocks 0-5 (positions 0-23) are dead
    assert sliding.tables[seq.seq_id][:6] == [NULL_BLOCK] * 6
    assert all(b is not NULL_BLOCK for b in sliding.tables[seq.seq_id][6:])
    assert sliding.usage().in_use == 2 and full.usage().in_use == 8
    assert sliding.usage().cached == 6           # hashed when full, so still findable
    kv.check(seqs=[seq])
    kv.free(seq)
    kv.check(expect_empty=True)


def test_unhashed_blocks_out_of_the_window_go_free():
    kv = HybridKVCacheManager((0, 6), [32, 32], block_size=4, enable_prefix_caching=False)
    seq = Sequence(list(range(30)), 30, 0, None)
    kv.admit([seq], 30)
    seq.num_computed_tokens = 30
    kv.cache_full_blocks(seq)
    usage = kv.groups[1].usage()
    assert (usage.in_use, usage.cached, usage.free) == (2, 0, 30)


def test_allocation_is_all_or_nothing_across_groups():
    kv = HybridKVCacheManager((0, 8), [64, 3], block_size=4)   # the sliding pool is the short one
    seq = Sequence(list(range(20)), 20, 0, None)
    assert not kv.allocate_slots(seq, 20)                      # 5 blocks: fits group 0 only
    assert kv.groups[0].usage().in_use == 0 and not kv.tables
    assert kv.admit([seq], 20) is None
    kv.check(expect_empty=True)
    assert kv.allocate_slots(seq, 12)
    assert [g.usage().in_use for g in kv.groups] == [3, 3]


def evict(group, seq: Sequence, i: int) -> None:
    """Drop block i of seq's tokens from group's prefix cache, as eviction would."""
    block = group.pool.lookup(group.block_hashes(seq, i + 1)[i])
    group.pool.incref(block)
    group.pool._evict(block)
    group.pool.decref(block)


def test_prefix_hit_needs_only_the_window_in_a_sliding_group():
    kv = HybridKVCacheManager((0, 6), [32, 32], block_size=4)
    first = Sequence(list(range(41)), 41, 0, None)
    kv.admit([first], 41)
    first.num_computed_tokens = 41
    kv.cache_full_blocks(first)
    kv.free(first)
    sliding = kv.groups[1]
    # evict an early block of the sliding group: hits that need it become invalid, later ones not
    evict(sliding, first, 1)
    again = Sequence(list(range(41)), 41, 0, None)
    hits = kv.find_cached_prefix(again)
    assert len(hits[0]) == len(hits[1]) == 10                 # a hit of 10 blocks needs 40-45 only
    assert hits[1][:8] == [NULL_BLOCK] * 8 and NULL_BLOCK not in hits[0]
    # block 9 missing too: a hit of 10 blocks lacks it, one of 9 needs blocks 7-8 only
    evict(sliding, first, 9)
    assert kv.cached_prefix_length(list(range(41))) == 9
    assert kv.admit([again], 64) == [36]
    assert kv.groups[1].tables[again.seq_id][:7] == [NULL_BLOCK] * 7
    kv.check(seqs=[again])
    # a short prompt whose window needs the evicted block 1: no hit past it (2 and 3 need it)
    short = Sequence(list(range(13)), 13, 0, None)
    assert len(kv.find_cached_prefix(short)[0]) == 1


def test_sizing_gives_the_window_savings_to_the_full_group():
    groups = kv_groups(AutoConfig.for_model("qwen2", num_hidden_layers=6, max_window_layers=1,
                                            use_sliding_window=True, sliding_window=512))
    assert groups.windows == (0, 512) and len(groups.layers(1)) == 5
    layer_block, budget = 1000, 6000 * 100_000                 # 100,000 blocks of every layer
    plan = kv_sizing.plan(groups, layer_block, 16, 8, 1024, None, budget, 0)
    need = kv_sizing.sliding_blocks_needed(512, 16, 8, 1024)
    assert plan.num_blocks[1] == need == 8 * (32 + 2) + 64
    assert plan.num_blocks[0] == (budget - need * 5 * layer_block) // layer_block > 100_000
    fixed = kv_sizing.plan(groups, layer_block, 16, 8, 1024, 40, None, 0)
    assert fixed.num_blocks == [40, 40]                        # num_kv_blocks: group 0, and a cap
    one = kv_groups(AutoConfig.for_model("llama", num_hidden_layers=6))
    assert kv_sizing.plan(one, layer_block, 16, 8, 1024, None, budget, 2**30).num_blocks == [100_000]


# ---- the engine against transformers -----------------------------------------------------------
def test_the_window_changes_the_output(tiny_root, tmp_path):
    """The references below can fail: the same weights without the window decode otherwise."""
    path = tiny_models.build(MIXED, tiny_root)
    unwindowed = str(tmp_path / "no-window")
    shutil.copytree(path, unwindowed)
    config = json.loads((tmp_path / "no-window" / "config.json").read_text())
    config.update(use_sliding_window=False, layer_types=["full_attention"] * 3)
    (tmp_path / "no-window" / "config.json").write_text(json.dumps(config))
    prompt = long_prompts(1, window_of(path))[0]
    with torch.inference_mode():
        logits = [hf_model(p)(torch.tensor([prompt])).logits[0, -1] for p in (path, unwindowed)]
    assert (logits[0] - logits[1]).abs().max() > 0.05
    params = SAMPLED(12)
    assert hf_expected(path, prompt, params) != hf_expected(unwindowed, prompt, params)


@pytest.mark.parametrize("kind", [MIXED, SLIDING])
def test_batched_prompts_three_windows_long_equal_transformers(kind, tiny_root):
    path = tiny_models.build(kind, tiny_root)
    window = window_of(path)
    llm = LLM(path, num_kv_blocks=256, debug_checks=True, max_num_batched_tokens=64)
    batch = long_prompts(3, window, seed=3)
    params = [greedy(24), SAMPLED(24), greedy(24)]
    outs, seen = run(llm, batch, params)
    for prompt, sp, out in zip(batch, params, outs):
        assert [c.token_ids for c in out.outputs] == hf_expected(path, prompt, sp)
    sliding = [g for g in seen[-2].kv_groups if g.window]
    assert sliding and all(g.bytes_saved > 0 for g in sliding)
    assert max(s.kv_groups[-1].tokens_held for s in seen) <= 3 * (window + 16)
    assert llm.stats().blocks_in_use == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("kind,num_blocks", [(MIXED, 24), (SLIDING, 12)])
def test_preemption_keeps_outputs(kind, num_blocks, mode, tiny_root):
    path = tiny_models.build(kind, tiny_root)
    window = window_of(path)
    llm = LLM(path, num_kv_blocks=num_blocks, block_size=8, preemption_mode=mode, debug_checks=True,
              swap_space_gb=0.01, max_num_batched_tokens=48)
    batch = long_prompts(3, window, seed=5)
    params = [SAMPLED(24), greedy(24), SAMPLED(24)]
    outs, _ = run(llm, batch, params)
    assert llm.stats().num_preemptions > 0
    if mode == "swap":
        assert llm.stats().num_swapped_out > 0
    for prompt, sp, out in zip(batch, params, outs):
        assert [c.token_ids for c in out.outputs] == hf_expected(path, prompt, sp)


@pytest.mark.parametrize("kind", [MIXED, SLIDING])
def test_prefix_hits_across_the_window(kind, tiny_root):
    path = tiny_models.build(kind, tiny_root)
    window = window_of(path)
    llm = LLM(path, num_kv_blocks=128, block_size=4, debug_checks=True)
    shared = long_prompts(1, window, seed=7)[0]
    batch = [shared, shared + [5, 6, 7], shared[:-9]]
    first = llm.generate(batch[:1], SAMPLED(20))
    outs = llm.generate(batch[1:], SAMPLED(20))
    assert all(o.metrics.num_cached_tokens > window for o in outs)
    for prompt, out in zip(batch, first + outs):
        assert out.outputs[0].token_ids == hf_expected(path, prompt, SAMPLED(20))[0]


@pytest.mark.parametrize("kind", [MIXED, SLIDING])
def test_parallel_samples_share_null_entries(kind, tiny_root):
    path = tiny_models.build(kind, tiny_root)
    window = window_of(path)
    llm = LLM(path, num_kv_blocks=128, block_size=8, debug_checks=True)
    prompt = long_prompts(1, window, seed=11)[0]
    params = SamplingParams(n=3, temperature=0.9, seed=4, max_tokens=20, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    assert [c.token_ids for c in out.outputs] == hf_expected(path, prompt, params)


def test_beams_over_the_window_equal_transformers(tiny_root):
    path = tiny_models.build(MIXED, tiny_root)
    llm = LLM(path, num_kv_blocks=128, block_size=8, debug_checks=True)
    prompt = long_prompts(1, window_of(path), seed=13)[0]
    out = llm.beam_search([prompt], 3, 10, ignore_eos=True)[0]
    ref, _scores = hf_beams(path, prompt, 3, 10)
    assert [c.token_ids for c in out.outputs] == ref


def test_speculation_over_the_window_keeps_outputs(tiny_root):
    path = tiny_models.build(MIXED, tiny_root)
    llm = LLM(path, num_kv_blocks=64, block_size=4, debug_checks=True, speculation="ngram")
    prompt = long_prompts(1, window_of(path), seed=17)[0]
    prompt = prompt + prompt[1:40]                              # something for n-grams to draft
    out = llm.generate([prompt], greedy(40))[0]
    assert out.outputs[0].token_ids == hf_greedy(path, prompt, 40)
    assert llm.stats().draft_tokens > 0


def test_a_long_conversation_holds_a_window_per_sliding_layer(tiny_root):
    """4,000 tokens on a window of 512 (block size 16): each sliding layer holds at most the
    window plus one block of the sequence, and the output equals transformers' run."""
    path = tiny_models.build("qwen2-window512", tiny_root)
    llm = LLM(path, num_kv_blocks=300, block_size=16, debug_checks=True)
    assert isinstance(llm.engine.block_manager, HybridKVCacheManager)
    prompt = prompts(1, seed=19, lo=3900, hi=3901)[0]
    outs, seen = run(llm, [prompt], greedy(100))
    assert outs[0].outputs[0].token_ids == hf_greedy(path, prompt, 100)
    full, sliding = seen[-2].kv_groups                         # the last step before the end
    assert full.tokens_held > 3900 and sliding.num_layers == 2
    assert max(s.kv_groups[1].tokens_held for s in seen[:-1]) <= 512 + 16
    assert max(s.kv_groups[1].blocks_in_use for s in seen[:-1]) <= 512 // 16 + 1
    # bytes saved: the blocks the sliding tables gave back, 2 layers x K,V x 16 x 2 heads x 16 x fp32
    assert sliding.bytes_saved == (full.blocks_in_use - sliding.blocks_in_use) * 2 * 2 * 16 * 2 * 16 * 4
    assert seen[-2].window_bytes_saved == sliding.bytes_saved > 0


def test_a_model_without_windows_keeps_the_plain_manager(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=32)
    assert type(llm.engine.block_manager) is KVCacheManager
    assert llm.stats().kv_groups == ()


def test_engine_panel_shows_the_sliding_groups(tiny_root):
    """The UI's KV map stays group 0's; one line per sliding group and the bytes saved."""
    path = tiny_models.build(MIXED, tiny_root)
    llm = LLM(path, num_kv_blocks=64, block_size=4)
    engine = llm.engine
    engine.add_request("a", long_prompts(1, window_of(path), seed=23)[0], greedy(4))
    engine.step()                                             # the prompt: past the window
    stats = llm.stats(with_block_tables=True)
    page = kvmap.render_panel(kvmap.KvSnapshot(True, stats=stats))
    g = stats.kv_groups[1]
    assert g.blocks_in_use < stats.blocks_in_use and stats.window_bytes_saved > 0
    assert (f"Sliding window 20 (2 layers): {g.blocks_in_use} of {g.num_blocks} blocks in use"
            in page) and "The windows save" in page
    assert stats.block_tables["a"][0] == engine.block_manager.block_ids(engine.groups["a"].seqs[0])
