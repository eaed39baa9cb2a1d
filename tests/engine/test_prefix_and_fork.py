"""Prefix caching skips the shared prefix; fork shares blocks and copies a shared last block once."""

from helpers.engine_helpers import greedy, prompts

from localpaged import LLM
from localpaged.core.kv_cache_manager import KVCacheManager
from localpaged.core.request import Sequence


def test_second_request_with_same_200_token_prefix(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=128)
    prefix = prompts(1, seed=3, lo=200, hi=201)[0]
    first = llm.generate([prefix + [10, 11, 12]], greedy(8))[0]
    computed_before = llm.engine.num_tokens_computed
    hits_before = llm.stats().prefix_cache_hits
    second = llm.generate([prefix + [20, 21]], greedy(8))[0]
    hits = llm.stats().prefix_cache_hits - hits_before
    assert hits >= 192
    assert second.metrics.num_cached_tokens >= 192
    # The model computed only the uncached tail of the prompt and the new tokens.
    computed = llm.engine.num_tokens_computed - computed_before
    assert computed == len(prefix) + 2 - hits + 7
    assert first.metrics.num_cached_tokens == 0


def test_fork_and_append_copies_shared_last_block_once():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    parent = Sequence(list(range(10)), 10, 0, None)          # 2 full blocks + 2 tokens
    assert kv.allocate_slots(parent, 10)
    parent.num_computed_tokens = 10
    child = parent.fork(1, None)
    kv.fork(parent, child)
    assert kv.block_ids(parent) == kv.block_ids(child)
    assert all(kv.pool.blocks[b].ref_count == 2 for b in kv.block_ids(parent))
    for seq in (parent, child):                              # each appends one token
        seq.token_ids.append(99)
        assert kv.allocate_slots(seq, 1)
    assert len(kv.pending_copies) == 1                       # one copy-on-write, not two
    src, dst = kv.pending_copies[0]
    p, c = kv.block_ids(parent), kv.block_ids(child)
    assert p[:2] == c[:2]                                    # full blocks still shared
    assert {p[2], c[2]} == {src, dst} and p[2] != c[2]
    assert kv.pool.blocks[src].ref_count == 1 and kv.pool.blocks[dst].ref_count == 1
    kv.free(parent)
    kv.free(child)
    assert kv.pool.num_free == 16


def test_parallel_samples_share_prompt_blocks(tiny_llama):
    from localpaged import SamplingParams
    llm = LLM(tiny_llama, num_kv_blocks=128)
    engine = llm.engine
    prompt = prompts(1, seed=5, lo=70, hi=71)[0]
    engine.add_request("r", prompt, SamplingParams(n=4, temperature=1.0, seed=1, max_tokens=12))
    seen_sharing = False
    while engine.has_unfinished_requests():
        engine.step()
        stats = llm.stats()
        if stats.blocks_in_use and len(engine.groups.get("r", None).seqs if "r" in engine.groups else []) == 4:
            assert stats.blocks_in_use < stats.blocks_without_sharing
            seen_sharing = True
    assert seen_sharing


def test_a_fork_inside_a_block_computes_one_token(tiny_llama):
    """A reply forked at one of its tokens (the reply's first t tokens, then another token) is
    found in the prefix cache up to that token, through the block it leaves mid-way (a private
    copy of the cached block): the new request's first step computes its last token only, a
    decode step, and its greedy tokens are those of the same prompt on an engine with nothing
    cached."""
    llm = LLM(tiny_llama, num_kv_blocks=128, debug_checks=True)
    eng = llm.engine
    prompt = prompts(1, seed=7, lo=40, hi=41)[0]
    reply = llm.generate([prompt], greedy(40))[0].outputs[0].token_ids
    for t in (21, 9):                       # the fork lands inside block 3, then inside block 3 again
        forked = prompt + reply[:t] + [(reply[t] + 1) % 512]
        assert len(forked) % 16 not in (0, 1)
        before = eng.num_tokens_computed
        eng.add_request(f"fork-{t}", forked, greedy(8))
        outs = eng.step()
        assert eng.num_tokens_computed - before == 1
        assert len(outs[0].outputs[0].token_ids) == 1            # its first token, after one step
        while eng.has_unfinished_requests():
            outs = eng.step()
        out = outs[0]
        assert out.finished and out.metrics.num_cached_tokens == len(forked) - 1
        fresh = LLM(tiny_llama, num_kv_blocks=128, enable_prefix_caching=False)
        assert out.outputs[0].token_ids == fresh.generate([forked], greedy(8))[0].outputs[0].token_ids


def test_an_edit_inside_a_block_reuses_the_tokens_before_it(tiny_llama):
    """A prompt that differs from a cached one from position p on (p inside a block) reuses the
    first p tokens, the same output as without the cache."""
    llm = LLM(tiny_llama, num_kv_blocks=128, debug_checks=True)
    prompt = prompts(1, seed=8, lo=60, hi=61)[0]
    llm.generate([prompt], greedy(4))
    edited = prompt[:37] + [(prompt[37] + 5) % 512] + prompt[38:]
    out = llm.generate([edited], greedy(6))[0]
    assert out.metrics.num_cached_tokens == 37
    fresh = LLM(tiny_llama, num_kv_blocks=128, enable_prefix_caching=False)
    assert out.outputs[0].token_ids == fresh.generate([edited], greedy(6))[0].outputs[0].token_ids
