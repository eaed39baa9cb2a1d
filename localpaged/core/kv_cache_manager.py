"""KVCacheManager: block tables, copy-on-write, prefix caching and swap, in block ids only.

This module owns the block tables, admission (`admit`; its rule is core.admission.admit_seqs)
and allocation (copy-on-write, fork, free, trim), the queue of block moves and `check()`; the
prefix cache and the disk tier are its base `PrefixCaching` (core.prefix_cache), swap to the
CPU pool its base `Swapping` (core.block_swap), the pools' usage figures (BlockUsage) its base
`UsageFigures` (core.block_usage).

Each sequence has a block table: the physical blocks holding its logical blocks 0, 1, 2, ...
Token t of a sequence lives in slot ``table[t // B].block_id * B + t % B``.

Invariants:
- Every block in a table has ref_count >= 1; tables only grow, except on copy-on-write (the last
  block is replaced by a private copy) and on free / swap.
- A shared block (ref_count > 1) is never written: before a sequence writes into its partly
  filled last block, `allocate_slots` gives it a private copy and queues the copy in
  `pending_copies` for the model runner to carry out before the forward pass.
- A block is registered in the prefix cache only when it is full and its K/V are computed.
- A prefix hit may end inside a block (core.partial_prefix): the sequence's table gets a private
  copy of the cached block whose first tokens it shares, never the cached block itself.
- Moves of block contents (copy-on-write, a cached block moved out of a growing table's way,
  swap out, swap in) are queued as typed `BlockOp`s, in the order they were decided, for the
  model runner to carry out before the next forward pass.
- A table entry may be NULL_BLOCK (block_pool) only in a sliding-window group's table
  (core.sliding_window): it holds nothing and is skipped by ref counts, swaps and the cache.
`check()` verifies these invariants (and the pool's) on demand: tests call it, and the engine runs
it after every step when `EngineConfig.debug_checks` is set.
See docs/architecture.md §2 (invariants) and §5 step 2 (admission, allocation).
"""

from __future__ import annotations

from localpaged.core.admission import admit_seqs
from localpaged.core.block_invariants import InvariantError, check_pools
from localpaged.core.block_pool import (
    NULL_BLOCK,
    Block,
    BlockOp,
    BlockOpKind,
    BlockPool,
)
from localpaged.core.block_swap import Swapping
from localpaged.core.block_usage import BlockUsage, UsageFigures
from localpaged.core.partial_prefix import TailIndex, tail_of
from localpaged.core.prefix_cache import DiskTier, PrefixCaching
from localpaged.core.request import Sequence


class KVCacheManager(PrefixCaching, Swapping, UsageFigures):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 num_cpu_blocks: int = 0, watermark: float = 0.01, keep_runs: bool = False,
                 group: int = 0) -> None:
        self.block_size = block_size
        self.group = group           # the KV-cache group whose tensors this manager's BlockOps move
        self.windows: tuple[int, ...] = (0,)              # one group, full attention
        # keep each table's blocks back to back where a free block allows (BlockPool.allocate_next):
        # the CPU batch-1 decode reads one run of blocks in place and joins several by a copy
        self.keep_runs = keep_runs
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.tails = TailIndex(self.pool)               # cached full blocks by parent hash
        self.cpu_pool = BlockPool(num_cpu_blocks, False) if num_cpu_blocks > 0 else None
        self.watermark_blocks = max(1, int(watermark * num_blocks)) if num_blocks > 8 else 0
        self.tables: dict[int, list[Block]] = {}
        self.cpu_tables: dict[int, list[Block]] = {}
        self._hashes: dict[int, list[bytes]] = {}       # chain hashes of each seq's full blocks
        self.block_ops: list[BlockOp] = []               # decided, not yet carried out; in order
        self.prefix_cache_queries = 0                    # tokens looked up
        self.prefix_cache_hits = 0                       # tokens found (memory or disk)
        self.disk: DiskTier | None = None                # set by attach_disk
        self.prefix_cache_disk_hits = 0                  # of the hits, tokens read back from disk
        self.last_disk_tokens = 0                        # of the latest lookup's hit, from disk
        self.admitted_disk_tokens: list[int] = []        # per seq of the latest admit (see admit)
        self.from_disk: dict[bytes, Block] = {}          # read back, not yet used by a hit

    # ---- allocation ---------------------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_new_tokens: int, num_cached: int = 0) -> int:
        table = self.tables.get(seq.seq_id, [])
        total = -(-(seq.num_computed_tokens + num_cached + num_new_tokens) // self.block_size)
        need = max(0, total - max(len(table), num_cached // self.block_size))
        return need + int(self._needs_copy(seq))

    def admit(self, seqs: list[Sequence], budget: int,
              use_prefix_cache: bool = True) -> list[int] | None:
        """Admit waiting sequences (no table yet): prefix-cache hits (unless `use_prefix_cache`
        is off), then up to `budget` new tokens in all, keeping the watermark free; all or nothing.

        Returns the number of tokens each sequence got from the prefix cache (now computed), or
        None, with nothing held, when the blocks do not fit. After a success,
        `admitted_disk_tokens[i]` says how many of sequence i's came from the disk tier (blocks
        read back for it or ahead of it, core.disk_prefix.disk_tokens).
        """
        return admit_seqs(self, seqs, budget, use_prefix_cache)

    def fits_admission(self, seq: Sequence, num_new_tokens: int, hits: list[Block]) -> bool:
        """Whether admitting seq with these hits fits and keeps the watermark free."""
        return self.can_allocate(seq, num_new_tokens, hits, self.watermark_blocks)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       cached: list[Block] | None = None) -> bool:
        """Make room for num_new_tokens more tokens of seq; all or nothing.

        `cached` (prefix-cache hits, only for a sequence with no table yet) joins the table and
        counts as computed.
        """
        cached = [] if cached is None else cached       # a hit of only a tail is an empty list
        if not self.can_allocate(seq, num_new_tokens, cached):
            return False
        self.take_slots(seq, num_new_tokens, cached)
        seq.num_computed_tokens += self.hit_tokens(cached)
        return True

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached: list[Block],
                     keep_free: int = 0) -> bool:
        """Whether allocate_slots(seq, num_new_tokens, cached) fits, leaving keep_free blocks."""
        need = self.blocks_needed(seq, num_new_tokens, self.hit_tokens(cached))
        revived = sum(1 for b in cached if b.ref_count == 0 and b is not NULL_BLOCK)
        tail = tail_of(cached)
        held = int(tail is not None and tail.block.ref_count == 0)    # during its copy
        return need + revived + held + keep_free <= self.pool.num_free

    def take_slots(self, seq: Sequence, num_new_tokens: int, cached: list[Block]) -> None:
        """allocate_slots once it fits, except that seq.num_computed_tokens is left to the caller
        (a manager of several KV-cache groups counts the cached tokens once)."""
        table = self.tables.setdefault(seq.seq_id, [])
        for block in cached:
            if block is not NULL_BLOCK:
                self.pool.incref(block)
            table.append(block)
        if (tail := tail_of(cached)) is not None:
            self._copy_tail(table, tail.block)
        computed = seq.num_computed_tokens + self.hit_tokens(cached)
        if not cached and tail is None and self._needs_copy(seq):   # hits end on a private block
            self._copy_on_write(seq, table)
        total = -(-(computed + num_new_tokens) // self.block_size)
        while len(table) < total:
            table.append(self._new_block(table))

    def _new_block(self, table: list[Block]) -> Block:
        """A block for the end of `table` (see keep_runs); a cached block moved out of the way is
        queued as a copy, like copy-on-write's."""
        if not (self.keep_runs and table):
            return self.pool.allocate()
        block, move = self.pool.allocate_next(table[-1].block_id)
        if move:
            self._record(BlockOpKind.COPY, [move])
        return block

    def _copy_tail(self, table: list[Block], cached: Block) -> None:
        """A private copy of cached block at the end of table (a tail hit). The cached block is
        held while its copy's block is chosen, so that choice cannot take or move it; except
        where the table's runs want that very block next (keep_runs): then it becomes the
        private block itself, its tokens already in place, and its cached copy moves out of the
        way as any cached block there would (BlockPool.allocate_next)."""
        if (self.keep_runs and table and cached.ref_count == 0
                and cached.block_id == table[-1].block_id + 1):
            private = self._new_block(table)
        else:
            self.pool.incref(cached)
            private = self._new_block(table)
            self.pool.decref(cached)
        if private is not cached:
            self._record(BlockOpKind.COPY, [(cached.block_id, private.block_id)])
        table.append(private)

    def _needs_copy(self, seq: Sequence) -> bool:
        table = self.tables.get(seq.seq_id, [])
        last = seq.num_computed_tokens // self.block_size
        return (seq.num_computed_tokens % self.block_size != 0 and last < len(table)
                and table[last].ref_count > 1)

    def _copy_on_write(self, seq: Sequence, table: list[Block]) -> None:
        last = seq.num_computed_tokens // self.block_size
        shared = table[last]
        private = self.pool.allocate()
        self._record(BlockOpKind.COPY, [(shared.block_id, private.block_id)])
        self.pool.decref(shared)
        table[last] = private

    def _record(self, kind: BlockOpKind, pairs: list[tuple[int, int]]) -> None:
        """Queue a move; consecutive moves of one kind merge into one batched op, except a device
        copy touching a block the op already copies from or to: a batched op reads all its
        sources before it writes, so a chain (a -> b, then b -> c) must run as two ops."""
        if not pairs:
            return
        last = self.block_ops[-1] if self.block_ops else None
        if last and last.kind is kind and not (kind is BlockOpKind.COPY and _touch(last.pairs, pairs)):
            last.pairs.extend(pairs)
        else:
            self.block_ops.append(BlockOp(kind, list(pairs), self.group))

    def take_block_ops(self) -> list[BlockOp]:
        ops, self.block_ops = self.block_ops, []
        return ops

    @property
    def pending_copies(self) -> list[tuple[int, int]]:
        """The device-to-device copies among the pending block ops (read-only view)."""
        return [pair for op in self.block_ops if op.kind is BlockOpKind.COPY for pair in op.pairs]

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks of seq's table past the first num_tokens tokens' (a verified
        draft's rejected positions), tail first; they never held a computed token. With
        num_tokens = the computed tokens, a table is as long as between steps without drafts,
        so a later fork shares no block a write would then need to copy first."""
        table = self.tables.get(seq.seq_id, [])
        keep = -(-num_tokens // self.block_size)
        while len(table) > keep:
            self.pool.decref(table.pop())

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares every block of parent (ref_count + 1 each), so its K/V are computed as
        far as the parent's are."""
        child.num_computed_tokens = parent.num_computed_tokens
        table = list(self.tables.get(parent.seq_id, []))
        for block in table:
            if block is not NULL_BLOCK:           # a NULL entry is shared as NULL
                self.pool.incref(block)
        self.tables[child.seq_id] = table
        self._hashes[child.seq_id] = list(self._hashes.get(parent.seq_id, []))

    def free(self, seq: Sequence) -> int:
        """Drop seq's blocks, tail first, so its last block is the first to be evicted. With a
        disk tier, a hashed block whose last holder this is goes to it first (its K/V are
        computed: a block is hashed only then). Returns the device blocks it was the last
        holder of (now free or cached)."""
        released = 0
        for block in reversed(self.tables.pop(seq.seq_id, [])):
            if block is not NULL_BLOCK:
                self._release(block)
                released += block.ref_count == 0
        for block in reversed(self.cpu_tables.pop(seq.seq_id, [])):
            if block is not NULL_BLOCK:
                self.cpu_pool.decref(block)
        self._hashes.pop(seq.seq_id, None)
        return released

    def reset_computed(self, seq: Sequence) -> None:
        """Preemption by recompute: the sequence keeps its tokens and loses its K/V."""
        self.free(seq)
        seq.num_computed_tokens = 0

    # ---- introspection ------------------------------------------------------------------------
    def group_block_ids(self, group: int, seq: Sequence) -> list[int]:
        """Group `group`'s block table of seq: this manager's own (it is its only group)."""
        if group != 0:
            raise IndexError(f"group {group} of a manager of one group")
        return self.block_ids(seq)

    @property
    def groups(self) -> list[KVCacheManager]:
        """The managers of the KV-cache groups: this one alone."""
        return [self]

    def group_usage(self) -> list[BlockUsage]:
        """usage() per KV-cache group: this manager is one group."""
        return [self.usage()]

    # ---- invariants ---------------------------------------------------------------------------
    def check(self, expect_empty: bool = False, seqs: list[Sequence] | None = None) -> None:
        """Raise InvariantError unless the block invariants hold.

        - ref_count of every device and CPU block == number of block tables holding it;
        - a device block is in the free queue iff its ref_count is 0;
        - a cached block is indexed under its own hash, and a hashed block at position i of a
          table carries that sequence's chain hash of blocks 0..i (its stored tokens);
        - with expect_empty (every request has ended), no table and no held block remains;
        - given the live `seqs`, whatever a subclass checks per sequence (`_check_seqs`).
        (core.block_invariants.check_pools checks all but the last.)
        """
        check_pools(self, expect_empty)
        if seqs is not None:
            self._check_seqs(seqs)

    def _check_seqs(self, seqs: list[Sequence]) -> None:
        """Per-sequence invariants: a full-attention table holds no NULL entry."""
        for seq in seqs:
            for table in (self.tables.get(seq.seq_id, []), self.cpu_tables.get(seq.seq_id, [])):
                if any(b is NULL_BLOCK for b in table):
                    raise InvariantError(f"sequence {seq.seq_id}: a NULL entry in a "
                                         "full-attention block table")


def _touch(pairs: list[tuple[int, int]], more: list[tuple[int, int]]) -> bool:
    """Whether the copies `more` read or write a block that the copies `pairs` read or write."""
    return not {b for pair in pairs for b in pair}.isdisjoint(b for pair in more for b in pair)
