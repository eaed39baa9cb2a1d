"""SlidingWindowManager: the block tables of one sliding-window KV-cache group, which give back
the blocks that fall wholly out of the window.

A layer with window W lets the query at position p attend to the keys at positions
p - W < k <= p (models.layer_types). A sequence's next query is at p = num_computed_tokens (a
decode's, a draft's and a prefill chunk's queries are all at p or later), so no query of it will
read a key before p - W + 1 again.

Invariants (on top of KVCacheManager's):
- Block i of a table (positions i*B .. (i+1)*B - 1) is dead when its last position
  (i+1)*B - 1 < p - W + 1, i.e. i < num_dead(p) = max(0, (p - W + 1) // B).
- Between steps the dead entries of a table are exactly its first num_dead(p) entries, and
  each is NULL_BLOCK (block_pool): not ref-counted, never written or read; every later entry is
  a real block. `cache_full_blocks`, called whenever num_computed_tokens moves on, registers the
  blocks that became full first, then replaces the dead entries by NULL and drops their ref
  count: a hashed block stays in the prefix cache as evictable, an unhashed one goes free.
- A prefix hit of L blocks (`hit_lengths`) needs only the blocks overlapping the window of the
  query at L*B: blocks num_dead(L*B) .. L-1; the entries before them start as NULL.
- With a disk tier, the last holder's release of a hashed block saves it, whether its sequence
  ends or the window moves past it (`free_out_of_window`), so a later hit finds the window's
  blocks on disk.
- Fork shares NULL entries as NULL; swap moves the real blocks and keeps NULL entries NULL;
  trim never reaches a NULL entry (it keeps the first ceil(p / B) >= num_dead(p) entries).
`check(seqs=...)` verifies the placement of NULL entries for every live sequence.
"""

from __future__ import annotations

from localpaged.core.block_pool import NULL_BLOCK, Block
from localpaged.core.kv_cache_manager import InvariantError, KVCacheManager
from localpaged.core.request import Sequence


def num_dead_blocks(num_computed: int, window: int, block_size: int) -> int:
    """Blocks wholly before the window of the next query (at position num_computed)."""
    return max(0, (num_computed - window + 1) // block_size)


class SlidingWindowManager(KVCacheManager):
    def __init__(self, window: int, num_blocks: int, block_size: int, **kwargs) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        super().__init__(num_blocks, block_size, **kwargs)
        self.window = window
        self.windows = (window,)

    def num_dead(self, num_computed: int) -> int:
        return num_dead_blocks(num_computed, self.window, self.block_size)

    # ---- the window moves on ------------------------------------------------------------------
    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks that became full, then give back those now out of the window."""
        super().cache_full_blocks(seq)
        self.free_out_of_window(seq)

    def free_out_of_window(self, seq: Sequence) -> None:
        """Replace the dead entries of seq's table by NULL, tail first (as `free` does, so the
        older block is the later to be evicted). Dead entries form a prefix and the earlier ones
        are NULL already, so this walks back from the boundary to the first NULL: O(1) a step."""
        table = self.tables.get(seq.seq_id)
        if not table:
            return
        i = min(self.num_dead(seq.num_computed_tokens), len(table)) - 1
        while i >= 0 and table[i] is not NULL_BLOCK:
            self._release(table[i])            # with a disk tier, its last holder saves it
            table[i] = NULL_BLOCK
            i -= 1

    # ---- prefix cache -------------------------------------------------------------------------
    def hit_lengths(self, hashes: list[bytes]) -> list[bool]:
        """valid[L] for L = 0 .. len(hashes): whether this group can serve a prefix hit of L
        blocks, i.e. holds cached blocks num_dead(L*B) .. L-1 (blocks before them are not needed)."""
        return self.valid_lengths([self.pool.lookup(h) is not None for h in hashes])

    def valid_lengths(self, present: list[bool]) -> list[bool]:
        """valid[L]: whether the blocks marked present include blocks num_dead(L*B) .. L-1."""
        B, valid, run = self.block_size, [True], 0
        for L, p in enumerate(present, start=1):
            run = run + 1 if p else 0                  # present blocks ending at L-1
            valid.append(run >= L - self.num_dead(L * B))
        return valid

    def needed(self, num_blocks: int) -> range:
        """A hit of num_blocks blocks needs those overlapping the window of its next query."""
        return range(self.num_dead(num_blocks * self.block_size), num_blocks)

    def prefix_hits(self, hashes: list[bytes], num_blocks: int) -> list[Block]:
        """The table entries of a hit of num_blocks blocks (valid per hit_lengths): NULL for the
        blocks before the window of the query at num_blocks*B, then the cached blocks."""
        dead = self.num_dead(num_blocks * self.block_size)
        return [NULL_BLOCK] * dead + [self.pool.lookup(h) for h in hashes[dead:num_blocks]]

    # ---- invariants ---------------------------------------------------------------------------
    def _check_seqs(self, seqs: list[Sequence]) -> None:
        """Entries 0 .. num_dead(p)-1 of each live table are NULL, the rest real blocks."""
        for seq in seqs:
            dead = self.num_dead(seq.num_computed_tokens)
            for table in (self.tables.get(seq.seq_id), self.cpu_tables.get(seq.seq_id)):
                for i, block in enumerate(table or []):
                    if (block is NULL_BLOCK) != (i < dead):
                        raise InvariantError(
                            f"sequence {seq.seq_id}, window {self.window}: block {i} "
                            f"{'is' if block is NULL_BLOCK else 'is not'} NULL with "
                            f"{seq.num_computed_tokens} tokens computed ({dead} blocks dead)")
