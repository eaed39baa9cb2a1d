"""The block invariants every KV-cache manager keeps (core.kv_cache_manager, one per KV-cache
group of core.hybrid_kv_cache_manager), checked on demand: `KVCacheManager.check()`, run by the
tests and after every engine step with `EngineConfig.debug_checks`. See
docs/architecture.md §2 (invariants I1-I5)."""

from __future__ import annotations

from localpaged.core.block_pool import NULL_BLOCK, Block, BlockPool


class InvariantError(AssertionError):
    """A block-accounting invariant does not hold (a bug in the engine, never bad input)."""


def check_pools(kv, expect_empty: bool) -> None:
    """Raise InvariantError unless kv's (a KVCacheManager's) pools and tables agree: ref counts
    == tables holding each block (NULL entries hold nothing), the free queue holds exactly the
    blocks of ref_count 0, cached blocks sit under their own hash and a table's hashed block
    under its sequence's chain hash; with expect_empty, nothing is held."""
    _check_ref_counts(kv.pool, kv.tables, "device")
    if kv.cpu_pool is not None:
        _check_ref_counts(kv.cpu_pool, kv.cpu_tables, "CPU")
    elif kv.cpu_tables:
        raise InvariantError("CPU block tables exist without a CPU pool")
    for block in kv.pool.blocks:
        if (block.block_id in kv.pool.free_queue) != (block.ref_count == 0):
            raise InvariantError(f"block {block.block_id}: ref_count {block.ref_count} but "
                                 f"{'' if block.ref_count else 'not '}in the free queue")
    for h, block in kv.pool.cached.items():
        if block.block_hash != h:
            raise InvariantError(f"block {block.block_id} is cached under another hash")
    for seq_id, table in kv.tables.items():
        hashes = kv._hashes.get(seq_id, [])
        for i, block in enumerate(table[:len(hashes)]):
            if block.block_hash is not None and block.block_hash != hashes[i]:
                raise InvariantError(f"block {block.block_id} (block {i} of sequence {seq_id}) "
                                     "is cached under a hash of other tokens")
    if expect_empty and (kv.tables or kv.cpu_tables or kv.pool.num_free != kv.pool.num_blocks):
        raise InvariantError(f"blocks still held after every request ended: device tables "
                             f"{sorted(kv.tables)}, CPU tables {sorted(kv.cpu_tables)}, "
                             f"{kv.pool.num_blocks - kv.pool.num_free} blocks in use")


def _check_ref_counts(pool: BlockPool, tables: dict[int, list[Block]], where: str) -> None:
    holders: dict[int, int] = {}
    for table in tables.values():
        for block in table:
            if block is NULL_BLOCK:
                continue
            holders[block.block_id] = holders.get(block.block_id, 0) + 1
    for block in pool.blocks:
        if block.ref_count != holders.get(block.block_id, 0):
            raise InvariantError(f"{where} block {block.block_id}: ref_count {block.ref_count}, "
                                 f"held by {holders.get(block.block_id, 0)} block tables")
