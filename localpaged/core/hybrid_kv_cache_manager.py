"""HybridKVCacheManager: one block manager per KV-cache group (vLLM V1's hybrid KV-cache
manager), behind KVCacheManager's public API, for models with sliding-window layers.

A model's layers split into KV-cache groups by their window (models.layer_types.KVGroups): group
0 is full attention (a KVCacheManager) unless every layer slides; each sliding group is a
SlidingWindowManager. Every group has its own block pool, block tables and KV tensors
(runner.kv_cache), so a sliding group holds only the blocks of its window.

Invariants:
- Every group holds a table for the same sequences, each as long as the others (one entry per
  logical block), on the device or on the CPU alike; only the entries differ (a sliding group's
  entries before its window are NULL). `seq.num_computed_tokens` is moved once, here.
- All or nothing across groups: an allocation, admission or swap that fits in one group and
  not in another takes nothing anywhere, so the scheduler preempts when any group runs out.
- A prefix hit of L blocks is valid only if the full group holds blocks 0..L-1 and each sliding
  group holds the blocks overlapping its window for the query at L*B; the hit is the largest
  L valid in every group, leaving >= 1 token to compute. The chain hash of a block is the same
  in every group (same tokens); each group has its own hash -> block map.
- With a disk tier (core.disk_prefix), each group saves and reads back its own blocks (same
  chain hash, its own bytes); a hit read back is the longest valid in every group over memory
  and disk together.
- Block ops carry their group (BlockOp.group); `take_block_ops` hands them over group after
  group, each group's in the order decided (groups' tensors are disjoint).
Figures for the whole engine (usage, stored tokens, table entries, block_ids) are group 0's:
the full group's, or the only group's; `group_usage` gives every group's.
"""

from __future__ import annotations

from localpaged.core import disk_prefix
from localpaged.core.admission import admit_seqs
from localpaged.core.block_pool import NULL_BLOCK, Block, BlockOp, BlockOpKind
from localpaged.core.block_usage import BlockUsage
from localpaged.core.kv_cache_manager import InvariantError, KVCacheManager
from localpaged.core.multimodal import ImageSpan
from localpaged.core.prefix_cache import extend_chain
from localpaged.core.request import Sequence
from localpaged.core.sliding_window import SlidingWindowManager


class HybridKVCacheManager:
    def __init__(self, windows: tuple[int, ...], num_blocks: list[int], block_size: int,
                 enable_prefix_caching: bool = True, num_cpu_blocks: list[int] | None = None,
                 watermark: float = 0.01, keep_runs: bool = False) -> None:
        """windows[g]: group g's window (0: full attention, only as group 0); num_blocks[g] and
        num_cpu_blocks[g]: its device and CPU pool sizes."""
        if len(num_blocks) != len(windows) or 0 in windows[1:]:
            raise ValueError(f"windows {windows} need one pool size each and full attention first")
        cpu = num_cpu_blocks or [0] * len(windows)
        self.block_size = block_size
        self.windows = tuple(windows)
        self.groups: list[KVCacheManager] = []
        for g, (w, n, c) in enumerate(zip(windows, num_blocks, cpu)):
            kw = dict(enable_prefix_caching=enable_prefix_caching, num_cpu_blocks=c,
                      watermark=watermark, keep_runs=keep_runs, group=g)
            self.groups.append(SlidingWindowManager(w, n, block_size, **kw) if w
                               else KVCacheManager(n, block_size, **kw))
        self.prefix_cache_queries = 0                    # tokens looked up
        self.prefix_cache_hits = 0                       # tokens found (memory or disk)
        self.disk = None                                 # set by attach_disk
        self.prefix_cache_disk_hits = 0                  # of the hits, tokens from disk
        self.last_disk_tokens = 0                        # as KVCacheManager's
        self.admitted_disk_tokens: list[int] = []

    # ---- disk tier ----------------------------------------------------------------------------
    def attach_disk(self, disk) -> None:
        """Every group keeps its blocks on `disk` (keyed by chain hash and group) and reads a
        hit back from it; a hit is still valid only where it is valid in every group."""
        self.disk = disk
        for group in self.groups:
            group.attach_disk(disk)

    def prefetch(self, token_ids: list[int], max_reads: int | None = None,
                 images: tuple[ImageSpan, ...] = ()) -> int:
        """KVCacheManager.prefetch over every group (a hit valid in all of them)."""
        return self.main.prefetch_groups(self.groups, token_ids, max_reads, images)

    @property
    def main(self) -> KVCacheManager:
        """Group 0: the full-attention group, or the only group."""
        return self.groups[0]

    @property
    def pool(self):
        return self.main.pool

    @property
    def tables(self) -> dict[int, list[Block]]:
        return self.main.tables

    @property
    def cpu_tables(self) -> dict[int, list[Block]]:
        return self.main.cpu_tables

    # ---- prefix cache -------------------------------------------------------------------------
    def _hit_length(self, hashes: list[bytes]) -> int:
        """The largest L <= len(hashes) that every group can serve (see the invariants)."""
        return disk_prefix.longest_hit(self.groups, [disk_prefix.memory_present(g, hashes)
                                                     for g in self.groups])

    def _hits(self, hashes: list[bytes]) -> list[list[Block]]:
        L = self._hit_length(hashes)
        return [g.prefix_hits(hashes, L) if isinstance(g, SlidingWindowManager)
                else g._lookup_chain(hashes[:L]) for g in self.groups]

    def find_cached_prefix(self, seq: Sequence) -> list[list[Block]]:
        """Per group, the table entries of the longest valid prefix hit for seq, leaving >= 1
        token to compute (every list has the same length: the hit's blocks)."""
        if not self.pool.enable_caching:
            return self.no_hits()
        max_blocks = (len(seq.token_ids) - 1) // self.block_size
        hashes = self.main.block_hashes(seq, max_blocks)
        if self.disk is not None:
            disk_prefix.read_back(self.groups, hashes)
        hits = self._hits(hashes)
        if self.disk is not None:
            self.last_disk_tokens = disk_prefix.disk_tokens(self.groups, hashes, len(hits[0]),
                                                            self.block_size)
            self.prefix_cache_disk_hits += self.last_disk_tokens
        self.prefix_cache_queries += len(seq.token_ids)
        self.prefix_cache_hits += len(hits[0]) * self.block_size
        return hits

    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        return self.main.block_hashes(seq, num_blocks)

    def cached_prefix_block_ids(self, token_ids: list[int],
                                images: tuple[ImageSpan, ...] = ()) -> list[int]:
        """Ids of group 0's blocks of the longest valid hit for token_ids (its NULL entries
        left out); read-only, counts no query. Its length in blocks is len(...) only for a
        full group 0: use `cached_prefix_length` for the hit itself."""
        return [b.block_id for b in self._cached_hits(token_ids, images)[0] if b is not NULL_BLOCK]

    def cached_prefix_length(self, token_ids: list[int], images: tuple[ImageSpan, ...] = ()) -> int:
        """Blocks of the longest valid prefix hit for token_ids (read-only)."""
        return len(self._cached_hits(token_ids, images)[0])

    def cached_prefix_tokens(self, token_ids: list[int], images: tuple[ImageSpan, ...] = ()) -> int:
        """Tokens of token_ids a request would get from the cache if admitted now (whole blocks
        before the last token); read-only."""
        return self.cached_prefix_length(token_ids[:-1], images) * self.block_size

    def _cached_hits(self, token_ids: list[int],
                     images: tuple[ImageSpan, ...] = ()) -> list[list[Block]]:
        if not self.pool.enable_caching:
            return [[] for _ in self.groups]
        hashes: list[bytes] = []
        extend_chain(hashes, token_ids, len(token_ids) // self.block_size, self.block_size, images)
        return self._hits(hashes)

    def cache_full_blocks(self, seq: Sequence) -> None:
        for group in self.groups:
            group.cache_full_blocks(seq)

    def reset_prefix_cache(self) -> None:
        for group in self.groups:
            group.reset_prefix_cache()

    # ---- allocation ---------------------------------------------------------------------------
    def admit(self, seqs: list[Sequence], budget: int,
              use_prefix_cache: bool = True) -> list[int] | None:
        """KVCacheManager.admit over every group: all or nothing, each group keeping its own
        watermark free."""
        return admit_seqs(self, seqs, budget, use_prefix_cache)

    def no_hits(self) -> list[list[Block]]:
        return [[] for _ in self.groups]

    def hit_tokens(self, hits: list[list[Block]]) -> int:
        return len(hits[0]) * self.block_size

    def fits_admission(self, seq: Sequence, num_new_tokens: int, hits: list[list[Block]]) -> bool:
        return all(g.fits_admission(seq, num_new_tokens, h) for g, h in zip(self.groups, hits))

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       cached: list[list[Block]] | None = None) -> bool:
        """Room for num_new_tokens more tokens of seq in every group, or in none. `cached`:
        per group, the entries of a prefix hit (find_cached_prefix), for a seq with no table."""
        cached = cached or self.no_hits()
        if not all(g.can_allocate(seq, num_new_tokens, c) for g, c in zip(self.groups, cached)):
            return False
        for group, c in zip(self.groups, cached):
            group.take_slots(seq, num_new_tokens, c)
        seq.num_computed_tokens += len(cached[0]) * self.block_size
        return True

    def take_block_ops(self) -> list[BlockOp]:
        return [op for group in self.groups for op in group.take_block_ops()]

    @property
    def pending_copies(self) -> list[tuple[int, int, int]]:
        """(group, src, dst) of every pending device-to-device copy (read-only view)."""
        return [(g.group, src, dst) for g in self.groups for op in g.block_ops
                if op.kind is BlockOpKind.COPY for src, dst in op.pairs]

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        for group in self.groups:
            group.trim(seq, num_tokens)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        for group in self.groups:
            group.fork(parent, child)

    def free(self, seq: Sequence) -> int:
        """Frees seq in every group; returns the blocks released over all groups."""
        return sum(group.free(seq) for group in self.groups)

    def reset_computed(self, seq: Sequence) -> None:
        self.free(seq)
        seq.num_computed_tokens = 0

    # ---- swap ---------------------------------------------------------------------------------
    def can_swap_out(self, seqs: list[Sequence]) -> bool:
        return all(g.can_swap_out(seqs) for g in self.groups)

    def swap_out(self, seqs: list[Sequence]) -> None:
        for group in self.groups:
            group.swap_out(seqs)

    def can_swap_in(self, seqs: list[Sequence]) -> bool:
        return all(g.can_swap_in(seqs) for g in self.groups)

    def swap_in(self, seqs: list[Sequence]) -> None:
        for group in self.groups:
            group.swap_in(seqs)

    # ---- introspection ------------------------------------------------------------------------
    def block_ids(self, seq: Sequence) -> list[int]:
        return self.main.block_ids(seq)

    def group_block_ids(self, group: int, seq: Sequence) -> list[int]:
        """Group `group`'s block table of seq (0 in NULL entries)."""
        return self.groups[group].block_ids(seq)

    def live_block_ids(self, seq: Sequence) -> list[int]:
        """Group 0's blocks held by seq (NULL entries left out): for a map of held blocks."""
        return [b.block_id for b in self.main.tables.get(seq.seq_id, []) if b is not NULL_BLOCK]

    def usage(self) -> BlockUsage:
        return self.main.usage()

    def group_usage(self) -> list[BlockUsage]:
        return [g.usage() for g in self.groups]

    def num_stored_tokens(self, seqs: list[Sequence]) -> int:
        return self.main.num_stored_tokens(seqs)

    def num_table_entries(self) -> int:
        return self.main.num_table_entries()

    # ---- invariants ---------------------------------------------------------------------------
    def check(self, expect_empty: bool = False, seqs: list[Sequence] | None = None) -> None:
        """Every group's check, and the groups agree: tables for the same sequences, on the
        same side (device or CPU), one entry per logical block in each."""
        for group in self.groups:
            group.check(expect_empty, seqs)
        for g in self.groups[1:]:
            for mine, theirs, where in ((self.main.tables, g.tables, "device"),
                                        (self.main.cpu_tables, g.cpu_tables, "CPU")):
                lengths = {k: len(t) for k, t in mine.items()}
                if lengths != {k: len(t) for k, t in theirs.items()}:
                    raise InvariantError(f"{where} block tables of group {g.group} differ from "
                                         f"group 0's: {lengths} vs "
                                         f"{ {k: len(t) for k, t in theirs.items()} }")
