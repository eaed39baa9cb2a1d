"""Preemption by swap, for one KV-cache group's block manager: block tables moved between the
device pool and the CPU pool, in block ids only.

`Swapping` is the half of KVCacheManager (core.kv_cache_manager) that moves a preempted group's
sequences to the CPU pool (`swap_out`) and back (`swap_in`), each as one queued `BlockOp`
carried out by the model runner (runner.kv_cache) before the next forward; its state (pools,
tables, the op queue) is set by KVCacheManager.__init__.

Invariants:
- Blocks shared inside the swapped sequences stay shared: each block moves once and every table
  that held it holds its copy (ref counts carried over).
- NULL entries (a sliding-window group's blocks before its window) stay NULL and move nothing.
- A swap-in keeps the watermark free (`can_swap_in`), as admission does.
See docs/architecture.md §2 (I1, I7, I10) and §5 step 2 (preemption).
"""

from __future__ import annotations

from collections.abc import Callable

from localpaged.core.block_pool import NULL_BLOCK, Block, BlockOpKind, BlockPool
from localpaged.core.request import Sequence


class Swapping:
    """KVCacheManager's swap to and from the CPU pool (its state is set by
    KVCacheManager.__init__)."""
    pool: BlockPool
    cpu_pool: BlockPool | None
    tables: dict[int, list[Block]]
    cpu_tables: dict[int, list[Block]]
    watermark_blocks: int
    _record: Callable[[BlockOpKind, list[tuple[int, int]]], None]   # queues a BlockOp, in order

    def can_swap_out(self, seqs: list[Sequence]) -> bool:
        blocks = {b.block_id for s in seqs for b in self.tables.get(s.seq_id, []) if b is not NULL_BLOCK}
        return self.cpu_pool is not None and len(blocks) <= self.cpu_pool.num_free

    def swap_out(self, seqs: list[Sequence]) -> None:
        """Move seqs' blocks to the CPU pool; blocks shared inside the group stay shared."""
        self._record(BlockOpKind.SWAP_OUT, self._move(seqs, self.tables, self.cpu_tables, self.pool, self.cpu_pool))

    def can_swap_in(self, seqs: list[Sequence]) -> bool:
        blocks = {b.block_id for s in seqs for b in self.cpu_tables.get(s.seq_id, [])
                  if b is not NULL_BLOCK}
        return len(blocks) + self.watermark_blocks <= self.pool.num_free

    def swap_in(self, seqs: list[Sequence]) -> None:
        self._record(BlockOpKind.SWAP_IN, self._move(seqs, self.cpu_tables, self.tables, self.cpu_pool, self.pool))

    @staticmethod
    def _move(seqs, src_tables, dst_tables, src_pool, dst_pool) -> list[tuple[int, int]]:
        mapping: dict[int, Block] = {}
        for seq in seqs:
            new_table = []
            for block in src_tables.pop(seq.seq_id, []):
                if block is NULL_BLOCK:              # NULL entries stay NULL
                    new_table.append(block)
                    continue
                if block.block_id in mapping:
                    dst_pool.incref(mapping[block.block_id])
                else:
                    mapping[block.block_id] = dst_pool.allocate()
                new_table.append(mapping[block.block_id])
                src_pool.decref(block)
            dst_tables[seq.seq_id] = new_table
        return [(src, dst.block_id) for src, dst in mapping.items()]
