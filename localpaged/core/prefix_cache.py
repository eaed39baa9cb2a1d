"""The prefix cache of one KV-cache group's block manager: chain hashes, lookups, registration and
the disk tier, in block ids only.

A full block is keyed by its chain hash (`hash_block`: SHA-256 of its parent's hash, its token
ids and the extra keys of the images it holds); `extend_chain` hashes a sequence's full blocks
in order. `PrefixCaching` is the half of KVCacheManager (core.kv_cache_manager) that finds a new
sequence's longest cached prefix (`find_cached_prefix`: whole blocks, then a tail hit inside the
next block, core.partial_prefix), registers blocks once full and computed (`cache_full_blocks`)
and keeps full blocks on a disk tier (`DiskTier`, core.disk_prefix); its state (pool, tables,
chain hashes, counters, disk) is set by KVCacheManager.__init__.

Invariants:
- A block is registered in the prefix cache only when it is full and its K/V are computed.
- A cached block's hash describes the tokens stored in it: a hashed block at position i of a
  table carries that sequence's chain hash of blocks 0..i.
- The last token of a prompt is always recomputed (its logits are needed): a hit never covers
  it, so a cached block is never written.
- A prefix hit may end inside a block (core.partial_prefix): the sequence's table gets a private
  copy of the cached block whose first tokens it shares, never the cached block itself.
See docs/architecture.md §2 (invariants I4, I6, I8) and §4 (prefix caching).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Protocol

from localpaged.core import disk_prefix
from localpaged.core.block_pool import NULL_BLOCK, Block, BlockPool
from localpaged.core.multimodal import ImageSpan, block_extra_key, token_keys
from localpaged.core.partial_prefix import PrefixHit, TailIndex, tail_of
from localpaged.core.request import Sequence

def hash_block(parent: bytes | None, token_ids: list[int], extra: bytes = b"") -> bytes:
    """Chain hash of a full block: it names the block's tokens and everything before them."""
    h = hashlib.sha256(parent or b"root")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    h.update(extra)
    return h.digest()


def extend_chain(hashes: list[bytes], token_ids: list[int], num_blocks: int, block_size: int,
                 images: tuple[ImageSpan, ...] = ()) -> None:
    """Append the chain hashes of full blocks len(hashes) .. num_blocks-1 of token_ids; a block
    that holds tokens of `images` carries their content hashes (core.multimodal)."""
    for i in range(len(hashes), num_blocks):
        start, end = i * block_size, (i + 1) * block_size
        hashes.append(hash_block(hashes[-1] if hashes else None, token_ids[start:end],
                                 block_extra_key(images, start, end)))


class DiskTier(Protocol):
    """Where full blocks outlive the process (runner/kv_disk.py: KVDiskTier), keyed by chain hash
    and KV-cache group; `load` returns a block's bytes (opaque here) or None."""

    def contains(self, block_hash: bytes, group: int) -> bool: ...

    def load(self, block_hash: bytes, group: int) -> object | None: ...

    def save(self, block_hash: bytes, group: int, block_id: int) -> None: ...


class PrefixCaching:
    """KVCacheManager's prefix cache and disk tier (its state is set by KVCacheManager.__init__)."""
    block_size: int
    group: int                           # the KV-cache group this manager's blocks belong to
    pool: BlockPool
    tails: TailIndex
    tables: dict[int, list[Block]]
    _hashes: dict[int, list[bytes]]      # chain hashes of each seq's full blocks
    prefix_cache_queries: int
    prefix_cache_hits: int
    disk: DiskTier | None
    prefix_cache_disk_hits: int
    last_disk_tokens: int

    # ---- disk tier ----------------------------------------------------------------------------
    def attach_disk(self, disk: DiskTier) -> None:
        """From now on a prefix lookup that misses in memory reads full blocks back from `disk`
        (core.disk_prefix.read_back: a LOAD op, carried out before the next forward like every
        block move), and the last holder's free of a hashed block hands it to `disk` to keep."""
        self.disk = disk

    def _release(self, block: Block) -> None:
        """Drop one holder of a real block; the last holder of a hashed block (its K/V are
        computed: a block is hashed only then) first hands it to the disk tier."""
        if self.disk is not None and block.block_hash is not None and block.ref_count == 1:
            self.disk.save(block.block_hash, self.group, block.block_id)
        self.pool.decref(block)

    def valid_lengths(self, present: list[bool]) -> list[bool]:
        """valid[L] for L = 0 .. len(present): whether this group can serve a prefix hit of L
        blocks when it holds the blocks marked present: blocks 0 .. L-1."""
        valid = [True]
        for p in present:
            valid.append(valid[-1] and p)
        return valid

    def needed(self, num_blocks: int) -> range:
        """The blocks a prefix hit of num_blocks blocks needs in this group."""
        return range(num_blocks)

    def prefetch(self, token_ids: list[int], max_reads: int | None = None,
                 images: tuple[ImageSpan, ...] = ()) -> int:
        """Read ahead of a request: the blocks of token_ids' longest prefix the disk tier holds
        (with the prompt's `images`: their blocks keyed by each image's hash, as a request's),
        into free blocks that cache nothing (memory's cached blocks stay); returns how many
        were read (at most max_reads; 0 when nothing is left to read)."""
        return self.prefetch_groups([self], token_ids, max_reads, images)

    def prefetch_groups(self, groups, token_ids: list[int], max_reads: int | None,
                        images: tuple[ImageSpan, ...] = ()) -> int:
        if self.disk is None or not self.pool.enable_caching:
            return 0
        hashes: list[bytes] = []
        extend_chain(hashes, token_ids, len(token_ids) // self.block_size, self.block_size, images)
        return disk_prefix.read_back(groups, hashes, plain_only=True, max_reads=max_reads)

    # ---- prefix cache -------------------------------------------------------------------------
    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """Chain hashes of seq's first num_blocks full blocks (memoized: tokens only grow)."""
        hashes = self._hashes.setdefault(seq.seq_id, [])
        extend_chain(hashes, seq.token_ids, num_blocks, self.block_size, seq.images)
        return hashes[:num_blocks]

    def _lookup_chain(self, hashes: list[bytes]) -> list[Block]:
        """The cached blocks for the longest run of hashes found, from the first."""
        hits = []
        for h in hashes:
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def find_cached_prefix(self, seq: Sequence) -> list[Block]:
        """Cached blocks holding the longest prefix of seq's tokens, leaving >= 1 token to compute.

        The last token is always recomputed (its logits are needed), so a prompt that is all
        cached backs off one block: a cached block is never written. Where the hit stops inside
        a block, the cached block that shares the most of its first tokens is the hit's tail
        (core.partial_prefix), copied at allocation.
        """
        if not self.pool.enable_caching:
            return PrefixHit()
        max_blocks = (len(seq.token_ids) - 1) // self.block_size
        hashes = self.block_hashes(seq, max_blocks)
        if self.disk is not None:
            disk_prefix.read_back([self], hashes)
        hits = PrefixHit(self._lookup_chain(hashes))
        if self.disk is not None:
            self.last_disk_tokens = disk_prefix.disk_tokens([self], hashes, len(hits), self.block_size)
            self.prefix_cache_disk_hits += self.last_disk_tokens
        hits.tail = self._tail_after(hashes, len(hits), seq.token_ids, seq.images)
        self.prefix_cache_queries += len(seq.token_ids)
        self.prefix_cache_hits += self.hit_tokens(hits)
        return hits

    def _tail_after(self, hashes: list[bytes], num_hits: int, token_ids: list[int],
                    images: tuple[ImageSpan, ...] = ()):
        """The tail hit after num_hits full blocks of token_ids, if any (the last token left
        to compute); an image's positions match only the same image's (token_keys)."""
        start, end = num_hits * self.block_size, len(token_ids) - 1
        if start >= end:
            return None
        return self.tails.find(hashes[num_hits - 1] if num_hits else None,
                               token_keys(token_ids, images, start, min(end, start + self.block_size)))

    def cached_prefix_tokens(self, token_ids: list[int], images: tuple[ImageSpan, ...] = ()) -> int:
        """Tokens of token_ids (a prompt with these `images`) a request would get from the cache
        if admitted now: its full blocks before the last token, and a tail hit; read-only,
        counts no query."""
        if not self.pool.enable_caching:
            return 0
        hashes: list[bytes] = []
        extend_chain(hashes, token_ids, (len(token_ids) - 1) // self.block_size, self.block_size,
                     images)
        hits = PrefixHit(self._lookup_chain(hashes))
        hits.tail = self._tail_after(hashes, len(hits), token_ids, images)
        return self.hit_tokens(hits)

    def cached_prefix_block_ids(self, token_ids: list[int],
                                images: tuple[ImageSpan, ...] = ()) -> list[int]:
        """Ids of the cached blocks holding a prefix of token_ids (a prompt with these
        `images`); read-only, counts no query."""
        hashes: list[bytes] = []
        extend_chain(hashes, token_ids, len(token_ids) // self.block_size, self.block_size, images)
        return [b.block_id for b in self._lookup_chain(hashes)]

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks that became full and computed (called after each step)."""
        table = self.tables.get(seq.seq_id, [])
        num_full = min(seq.num_computed_tokens // self.block_size, len(table))
        hashes = self.block_hashes(seq, num_full)
        for i, (block, h) in enumerate(zip(table[:num_full], hashes)):
            if block is not NULL_BLOCK and self.pool.register(block, h):
                B = self.block_size
                self.tails.add(hashes[i - 1] if i else None, h,
                               token_keys(seq.token_ids, seq.images, i * B, (i + 1) * B))

    def no_hits(self) -> list[Block]:
        return []

    def hit_tokens(self, hits: list[Block]) -> int:
        tail = tail_of(hits)
        return len(hits) * self.block_size + (tail.num_tokens if tail else 0)

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (the blocks stay where they are)."""
        self.pool.reset_prefix_cache()
        self.tails.clear()
