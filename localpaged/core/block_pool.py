"""BlockPool: the physical KV blocks of one device, their ref counts and the prefix-cache index;
and BlockOp, a batched move of block contents that the KV cache manager decides.

The pool knows block ids only; the K/V tensors themselves live in `kv_cache.KVCache`, which
carries out the BlockOps (`KVCache.apply`).

Invariants:
- ref_count(block) == number of block tables holding it.
- A block is in the free queue iff its ref_count == 0. A free block that still has a hash is
  "cached": the prefix cache can find it and take it back (ref_count 0 -> 1) until it is evicted.
- Eviction order is the free queue's order: uncached blocks first, then cached blocks least
  recently freed first (a request frees its blocks tail-first, so its last block goes first).
- cached[h] is a block whose hash is h and whose stored tokens are the ones h describes.
- NULL_BLOCK belongs to no pool: a sliding-window table's placeholder for a block that fell
  wholly out of the window (core.sliding_window). It is never ref-counted, hashed, written or
  read; its block_id 0 is what the kernels get for it (they never read entries before a window).
See docs/architecture.md §4 (concepts -> modules) and §2 (invariants I1-I4).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None      # set once the block is full and computed


# A placeholder table entry (see the invariants above); compare by identity: `block is NULL_BLOCK`.
NULL_BLOCK = Block(0)


class BlockOpKind(enum.Enum):
    SWAP_OUT = "swap_out"    # device block -> CPU block (preemption by swap)
    COPY = "copy"            # device block -> device block (copy-on-write)
    SWAP_IN = "swap_in"      # CPU block -> device block (a swapped group resumes)
    LOAD = "load"            # bytes read back from the disk tier -> device block (runner/kv_disk.py)


@dataclass
class BlockOp:
    """Copy the contents of block src to block dst, for every (src, dst) pair, in the cache
    tensors of KV-cache group `group` (models.layer_types.KVGroups; 0 for a one-group model).
    LOAD: `data[i]` (the disk tier's bytes of a block, opaque here) goes to block pairs[i][1]."""
    kind: BlockOpKind
    pairs: list[tuple[int, int]] = field(default_factory=list)
    group: int = 0
    data: list = field(default_factory=list)


class NoFreeBlocksError(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, Block] = {}

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (truly free, or cached and evictable)."""
        return len(self.free_queue)

    @property
    def num_cached_free(self) -> int:
        return sum(1 for i in self.free_queue if self.blocks[i].block_hash is not None)

    def allocate(self) -> Block:
        """Take the block at the head of the free queue, evicting its cache entry if any."""
        if not self.free_queue:
            raise NoFreeBlocksError("no free KV blocks")
        block = self.blocks[self.free_queue.popitem(last=False)[0]]
        self._evict(block)
        block.ref_count = 1
        return block

    def allocate_next(self, last: int) -> tuple[Block, tuple[int, int] | None]:
        """Block `last + 1` when it is free, else as allocate(): for a table that ends with block
        `last`, so that its blocks lie back to back.

        If that block holds cached tokens, they move to the block allocate() would have taken
        (which is evicted just as allocate() would evict it) along with their hash and their
        place in the free queue; the pair (last + 1, new holder) is returned for the caller to
        copy. So the prefix cache keeps exactly the tokens, in exactly the eviction order, that
        allocate() would have left it."""
        wanted = last + 1
        if wanted not in self.free_queue or next(iter(self.free_queue)) == wanted:
            return self.allocate(), None
        block, move = self.blocks[wanted], None
        if block.block_hash is not None:
            holder = self.allocate()
            holder.ref_count, holder.block_hash, block.block_hash = 0, block.block_hash, None
            self.cached[holder.block_hash] = holder
            self.free_queue = OrderedDict((holder.block_id if i == wanted else i, None)
                                          for i in self.free_queue)
            move = (wanted, holder.block_id)
        else:
            del self.free_queue[wanted]
        block.ref_count = 1
        return block, move

    def incref(self, block: Block) -> None:
        if block.ref_count == 0:
            del self.free_queue[block.block_id]      # a cache hit on a freed block revives it
        block.ref_count += 1

    def decref(self, block: Block) -> None:
        assert block.ref_count > 0, f"block {block.block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_queue[block.block_id] = None
            if block.block_hash is None:
                self.free_queue.move_to_end(block.block_id, last=False)   # reuse plain blocks first

    def lookup(self, block_hash: bytes) -> Block | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def register(self, block: Block, block_hash: bytes) -> bool:
        """Make a full, computed block findable by the hash of its tokens (first writer wins);
        whether it was registered now."""
        if not self.enable_caching or block.block_hash is not None or block_hash in self.cached:
            return False
        block.block_hash = block_hash
        self.cached[block_hash] = block
        return True

    def _evict(self, block: Block) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None

    def reset_prefix_cache(self) -> None:
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
