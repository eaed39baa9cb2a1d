"""The usage figures of one KV-cache group's block manager: `BlockUsage` (a snapshot of the device
and CPU pools, in blocks) and `UsageFigures`, the half of KVCacheManager (core.kv_cache_manager)
that reads its tables and pools for stats and the UI's block map, in block ids only.

Read-only: nothing here changes a table, a pool or a ref count. NULL entries (a sliding-window
group's blocks before its window, core.sliding_window) hold nothing: they are left out of the
held blocks and the table entries and counted by `num_null_entries`. State (pools, tables,
block size) is set by KVCacheManager.__init__.
"""

from __future__ import annotations

from dataclasses import dataclass

from localpaged.core.block_pool import NULL_BLOCK, Block, BlockPool
from localpaged.core.request import Sequence


@dataclass(frozen=True)
class BlockUsage:
    """A snapshot of the pools (device, and CPU for swap), in blocks."""
    num_blocks: int
    in_use: int              # ref_count > 0
    cached: int              # ref_count == 0, still findable by the prefix cache
    free: int                # ref_count == 0, no cached content
    shared: int              # ref_count > 1
    table_entries: int       # what the tables would hold if nothing were shared
    num_cpu_blocks: int
    cpu_in_use: int


class UsageFigures:
    """KVCacheManager's usage figures (its state is set by KVCacheManager.__init__)."""
    block_size: int
    pool: BlockPool
    cpu_pool: BlockPool | None
    tables: dict[int, list[Block]]

    def block_ids(self, seq: Sequence) -> list[int]:
        return [b.block_id for b in self.tables.get(seq.seq_id, [])]

    def live_block_ids(self, seq: Sequence) -> list[int]:
        """The blocks seq holds (NULL entries left out): for a map of held blocks."""
        return [b.block_id for b in self.tables.get(seq.seq_id, []) if b is not NULL_BLOCK]

    def usage(self) -> BlockUsage:
        """How the device and CPU pools' blocks are used now."""
        held = [b for b in self.pool.blocks if b.ref_count > 0]
        cached = self.pool.num_cached_free
        cpu = self.cpu_pool
        return BlockUsage(self.pool.num_blocks, len(held), cached, self.pool.num_free - cached,
                          sum(1 for b in held if b.ref_count > 1), self.num_table_entries(),
                          cpu.num_blocks if cpu else 0, cpu.num_blocks - cpu.num_free if cpu else 0)

    def num_stored_tokens(self, seqs: list[Sequence]) -> int:
        """Slots of held device blocks that store a computed token (a shared block counts once)."""
        filled: dict[int, int] = {}
        B = self.block_size
        for seq in seqs:
            for i, block in enumerate(self.tables.get(seq.seq_id, [])):
                if block is NULL_BLOCK:
                    continue
                n = min(B, max(0, seq.num_computed_tokens - i * B))
                filled[block.block_id] = max(filled.get(block.block_id, 0), n)
        return sum(filled.values())

    def num_table_entries(self) -> int:
        """Blocks that would be held if nothing were shared (one per table entry)."""
        return sum(1 for t in self.tables.values() for b in t if b is not NULL_BLOCK)

    def num_null_entries(self) -> int:
        """NULL entries of the device tables: blocks a sliding window gave back."""
        return sum(1 for t in self.tables.values() for b in t if b is NULL_BLOCK)
