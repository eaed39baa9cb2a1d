"""KVCacheManager.check() catches broken block accounting, and the engine's debug flag runs it
every step (the invariants of localpaged/core/kv_cache_manager.py and block_pool.py)."""

import pytest
from helpers.engine_helpers import greedy, prompts

from localpaged import LLM
from localpaged.core.block_pool import NULL_BLOCK
from localpaged.core.hybrid_kv_cache_manager import HybridKVCacheManager
from localpaged.core.kv_cache_manager import InvariantError, KVCacheManager
from localpaged.core.prefix_cache import hash_block
from localpaged.core.request import Sequence


def forked_pair() -> tuple[KVCacheManager, Sequence, Sequence]:
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True, num_cpu_blocks=4)
    parent = Sequence(list(range(10)), 10, 0, None)          # 2 full blocks + 2 tokens
    assert kv.admit([parent], 10) == [0]
    parent.num_computed_tokens = 10
    kv.cache_full_blocks(parent)
    child = parent.fork(1, None)
    kv.fork(parent, child)
    kv.check()
    return kv, parent, child


def test_check_catches_a_broken_ref_count():
    kv, parent, _child = forked_pair()
    shared = kv.pool.blocks[kv.block_ids(parent)[0]]
    shared.ref_count -= 1                                     # one table too few
    with pytest.raises(InvariantError, match=f"block {shared.block_id}: ref_count 1, held by 2"):
        kv.check()


def test_check_catches_a_held_block_in_the_free_queue():
    kv, parent, _child = forked_pair()
    kv.pool.free_queue[kv.block_ids(parent)[2]] = None
    with pytest.raises(InvariantError, match="in the free queue"):
        kv.check()


def test_check_catches_a_cached_hash_of_other_tokens():
    kv, parent, _child = forked_pair()
    block = kv.pool.blocks[kv.block_ids(parent)[1]]
    del kv.pool.cached[block.block_hash]
    block.block_hash = hash_block(None, [7, 7, 7, 7])
    kv.pool.cached[block.block_hash] = block
    with pytest.raises(InvariantError, match="hash of other tokens"):
        kv.check()


def test_check_catches_blocks_held_after_every_request_ended():
    kv, parent, child = forked_pair()
    kv.free(parent)
    with pytest.raises(InvariantError, match="still held"):
        kv.check(expect_empty=True)
    kv.free(child)
    kv.check(expect_empty=True)


def test_engine_debug_flag_checks_every_step(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=32, debug_checks=True)
    engine = llm.engine
    prompt = prompts(1, seed=9, lo=40, hi=41)[0]
    engine.add_request("a", prompt, greedy(6))
    engine.step()                                            # the prompt: blocks now held
    block = next(b for b in engine.block_manager.pool.blocks if b.ref_count > 0)
    block.ref_count += 1                                     # a bug: a reference nobody holds
    with pytest.raises(InvariantError, match=f"block {block.block_id}: ref_count 2, held by 1"):
        engine.step()
    block.ref_count -= 1
    while engine.has_unfinished_requests():                  # repaired: runs to the end, checked
        engine.step()
    assert llm.stats().blocks_in_use == 0


# ---- sliding-window groups (core.sliding_window, core.hybrid_kv_cache_manager) ----------------
def hybrid_with_a_window() -> tuple[HybridKVCacheManager, Sequence]:
    """Group 0 full, group 1 window 6, block size 4; 30 tokens computed: blocks 0-5 dead."""
    kv = HybridKVCacheManager((0, 6), [32, 32], block_size=4, num_cpu_blocks=[16, 16])
    seq = Sequence(list(range(30)), 30, 0, None)
    assert kv.admit([seq], 30) == [0]
    seq.num_computed_tokens = 30
    kv.cache_full_blocks(seq)
    kv.check(seqs=[seq])
    return kv, seq


def test_check_catches_a_null_entry_inside_the_window():
    kv, seq = hybrid_with_a_window()
    table = kv.groups[1].tables[seq.seq_id]
    kv.groups[1].pool.decref(table[6])
    table[6] = NULL_BLOCK
    with pytest.raises(InvariantError, match="block 6 is NULL with 30 tokens computed"):
        kv.check(seqs=[seq])


def test_check_catches_a_block_the_window_did_not_give_back():
    kv, seq = hybrid_with_a_window()
    table = kv.groups[1].tables[seq.seq_id]
    table[5] = kv.groups[1].pool.allocate()
    with pytest.raises(InvariantError, match="block 5 is not NULL"):
        kv.check(seqs=[seq])


def test_check_catches_groups_that_disagree_and_a_null_entry_in_a_full_table():
    kv, seq = hybrid_with_a_window()
    kv.groups[1].pool.decref(kv.groups[1].tables[seq.seq_id].pop())
    with pytest.raises(InvariantError, match="block tables of group 1 differ"):
        kv.check()
    kv, seq = hybrid_with_a_window()
    kv.groups[0].pool.decref(kv.groups[0].tables[seq.seq_id][0])
    kv.groups[0].tables[seq.seq_id][0] = NULL_BLOCK
    with pytest.raises(InvariantError, match="NULL entry in a full-attention block table"):
        kv.check(seqs=[seq])


def test_swap_keeps_null_entries_and_check_covers_every_group():
    kv, seq = hybrid_with_a_window()
    assert kv.can_swap_out([seq])
    kv.swap_out([seq])
    ops = kv.take_block_ops()
    assert [(op.group, len(op.pairs)) for op in ops] == [(0, 8), (1, 2)]   # NULL entries stay
    assert kv.groups[1].cpu_tables[seq.seq_id][:6] == [NULL_BLOCK] * 6
    kv.check(seqs=[seq])
    kv.swap_in([seq])
    kv.check(seqs=[seq])
    kv.groups[1].pool.blocks[kv.group_block_ids(1, seq)[7]].ref_count += 1
    with pytest.raises(InvariantError, match="ref_count 2, held by 1"):
        kv.check()
    kv.groups[1].pool.blocks[kv.group_block_ids(1, seq)[7]].ref_count -= 1
    kv.free(seq)
    kv.check(expect_empty=True)
    kv.groups[1].pool.allocate()                              # a block no table holds
    with pytest.raises(InvariantError, match="ref_count 1, held by 0"):
        kv.check(expect_empty=True)
