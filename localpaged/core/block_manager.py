"""BlockManager: the contract between the paper's block manager and everything above it.

The scheduler, the model runner and the engine hold a BlockManager and call only what this
Protocol states. Two classes implement it:
- core.kv_cache_manager.KVCacheManager: one pool and one block table per sequence (a model whose
  layers all attend to the whole context);
- core.hybrid_kv_cache_manager.HybridKVCacheManager: one KVCacheManager per KV-cache group (a
  model with sliding-window layers), every group moved together, all or nothing.
tests/core/test_block_manager.py checks that both implement every member, with the same
parameters.

Words: a block table is a sequence's list of physical blocks; a slot is block_id * block_size +
offset; `ref_count == number of block tables holding a block`; a block is shared copy-on-write
(`fork`), registered in the prefix cache once full and computed (`cache_full_blocks`), and moved
between devices by queued BlockOps that the runner carries out before the next forward pass
(`take_block_ops`). Group 0 is the full-attention group, or the only group: the figures for the
whole engine (`block_ids`, `usage`, `num_stored_tokens`) are its.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from localpaged.core.block_pool import Block, BlockOp, BlockPool
    from localpaged.core.block_usage import BlockUsage
    from localpaged.core.kv_cache_manager import KVCacheManager
    from localpaged.core.multimodal import ImageSpan
    from localpaged.core.prefix_cache import DiskTier
    from localpaged.core.request import Sequence


@runtime_checkable
class BlockManager(Protocol):
    """Block tables, copy-on-write, prefix caching, swap and the disk tier, in block ids only."""

    block_size: int
    windows: tuple[int, ...]          # per KV-cache group: its sliding window (0: full attention)
    prefix_cache_queries: int         # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int            # of those, tokens found (in memory or on disk)
    prefix_cache_disk_hits: int       # of the hits, tokens read back from the disk tier
    admitted_disk_tokens: list[int]   # per sequence of the latest `admit`: its hit's disk tokens

    @property
    def groups(self) -> list[KVCacheManager]:
        """One manager per KV-cache group, in the order of `windows`."""

    @property
    def pool(self) -> BlockPool:
        """Group 0's device pool (its size bounds a prompt)."""

    @property
    def tables(self) -> dict[int, list[Block]]:
        """seq_id -> group 0's device block table."""

    @property
    def cpu_tables(self) -> dict[int, list[Block]]:
        """seq_id -> group 0's block table of a sequence swapped out to CPU memory."""

    # ---- prefix cache and disk tier -----------------------------------------------------------
    def attach_disk(self, disk: DiskTier) -> None: ...
    def prefetch(self, token_ids: list[int], max_reads: int | None = None,
                 images: tuple[ImageSpan, ...] = ()) -> int: ...
    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]: ...
    # `images`: the prompt's (core.multimodal.ImageSpan), whose blocks are keyed by image hash
    def cached_prefix_block_ids(self, token_ids: list[int],
                                images: tuple[ImageSpan, ...] = ()) -> list[int]: ...
    def cached_prefix_tokens(self, token_ids: list[int],
                             images: tuple[ImageSpan, ...] = ()) -> int: ...
    def cache_full_blocks(self, seq: Sequence) -> None: ...
    def reset_prefix_cache(self) -> None: ...

    # ---- admission, allocation, copy-on-write -------------------------------------------------
    def admit(self, seqs: list[Sequence], budget: int,
              use_prefix_cache: bool = True) -> list[int] | None:
        """Admit a whole group of sequences (prefix hits, then slots for up to `budget` new
        tokens): the cached tokens of each, or None and nothing taken."""

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, cached=None) -> bool: ...
    def take_block_ops(self) -> list[BlockOp]: ...
    def fork(self, parent: Sequence, child: Sequence) -> None: ...
    def trim(self, seq: Sequence, num_tokens: int) -> None: ...
    def free(self, seq: Sequence) -> int: ...   # device blocks it was the last holder of
    def reset_computed(self, seq: Sequence) -> None: ...

    # ---- preemption by swap -------------------------------------------------------------------
    def can_swap_out(self, seqs: list[Sequence]) -> bool: ...
    def swap_out(self, seqs: list[Sequence]) -> None: ...
    def can_swap_in(self, seqs: list[Sequence]) -> bool: ...
    def swap_in(self, seqs: list[Sequence]) -> None: ...

    # ---- what the runner and the stats read ---------------------------------------------------
    def block_ids(self, seq: Sequence) -> list[int]: ...
    def group_block_ids(self, group: int, seq: Sequence) -> list[int]: ...
    def live_block_ids(self, seq: Sequence) -> list[int]: ...
    def usage(self) -> BlockUsage: ...
    def group_usage(self) -> list[BlockUsage]: ...
    def num_stored_tokens(self, seqs: list[Sequence]) -> int: ...
    def num_table_entries(self) -> int: ...
    def check(self, expect_empty: bool = False, seqs: list[Sequence] | None = None) -> None: ...
