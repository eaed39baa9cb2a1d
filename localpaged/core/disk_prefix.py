"""Prefix hits over memory and the disk tier, for one KV-cache group or several.

A group manager (core.kv_cache_manager.KVCacheManager, core.sliding_window.SlidingWindowManager)
says which of a prompt's full blocks a prefix hit of L blocks needs (`needed(L)`: a full group
0..L-1, a sliding group only the blocks overlapping the window of the query at L*B) and, given
which blocks it could serve (`present`), for which L it can (`valid_lengths`). A hit is valid
only if it is valid in every group (`longest_hit`).

`read_back` makes the longest hit that memory and the disk tier together can serve present in
memory: every needed block missing from a group's pool is read from that group's disk tier into
a fresh block, registered under its hash and left cached (ref count 0), its bytes queued as a
`BlockOp(LOAD)` behind the ops already decided. Invariants:
- while blocks are taken, every block the hit needs so far is held (ref count + 1), so no
  allocation evicts one; all are released before `read_back` returns, tail first;
- a block the disk cannot give (a miss, a damaged file) or no room for it makes that block
  absent and the hit is recomputed: a shorter hit, never a wrong block;
- a block read back is remembered in its group's `from_disk` until a hit first uses it, so a
  request's hit says how many of its tokens memory alone would not have had (`disk_tokens`),
  also when the blocks were read ahead of the request (a tab opened: `prefetch`).
"""

from __future__ import annotations

from localpaged.core.block_pool import Block, BlockOp, BlockOpKind


class OutOfReads(Exception):
    """A read budget (background prefetch reads a few blocks at a time) is spent."""


def memory_present(group, hashes: list[bytes]) -> list[bool]:
    return [group.pool.lookup(h) is not None for h in hashes]


def disk_present(group, hashes: list[bytes], absent: set[int]) -> list[bool]:
    """Whether memory or the group's disk tier holds each block (indices in `absent` not)."""
    disk = group.disk
    return [i not in absent and (group.pool.lookup(h) is not None
                                 or (disk is not None and disk.contains(h, group.group)))
            for i, h in enumerate(hashes)]


def longest_hit(groups, presents: list[list[bool]]) -> int:
    """The largest L that every group can serve, given what each holds (presents[k])."""
    valid = [all(v) for v in zip(*(g.valid_lengths(p) for g, p in zip(groups, presents)))]
    return max(L for L, ok in enumerate(valid) if ok)


def read_back(groups, hashes: list[bytes], plain_only: bool = False,
              max_reads: int | None = None) -> int:
    """Read the blocks of the longest hit over memory and disk into memory (see the module's
    invariants); returns how many blocks were read. plain_only: take only free blocks that
    cache nothing (read ahead of a request, never evicting what memory caches). max_reads:
    stop after that many (the rest on a later call)."""
    absent = [set() for _ in groups]
    held: list[list[Block]] = [[] for _ in groups]
    loads: list[list[tuple[int, object]]] = [[] for _ in groups]
    try:
        while True:
            L = longest_hit(groups, [disk_present(g, hashes, a) for g, a in zip(groups, absent)])
            if L <= longest_hit(groups, [memory_present(g, hashes) for g in groups]):
                break
            failed = next(((k, i) for k, g in enumerate(groups) for i in g.needed(L)
                           if not _hold(g, hashes[i], held[k], loads[k], plain_only, max_reads,
                                        sum(map(len, loads)))), None)
            if failed is None:
                break
            absent[failed[0]].add(failed[1])
    except OutOfReads:
        pass
    finally:
        for g, blocks, loaded in zip(groups, held, loads):
            for block in reversed(blocks):
                g.pool.decref(block)
            if loaded:
                g.block_ops.append(BlockOp(BlockOpKind.LOAD, [(b, b) for b, _ in loaded],
                                           g.group, [data for _, data in loaded]))
    return sum(map(len, loads))


def _hold(group, h: bytes, held: list[Block], loaded: list, plain_only: bool,
          max_reads: int | None, num_read: int) -> bool:
    """Hold the block for h in group's pool: a memory hit, or a fresh block read from disk."""
    pool = group.pool
    block = pool.lookup(h)
    if block is not None:
        pool.incref(block)
        held.append(block)
        return True
    if group.disk is None or pool.num_free <= group.watermark_blocks:
        return False
    if plain_only and pool.blocks[next(iter(pool.free_queue))].block_hash is not None:
        return False          # uncached free blocks come first in the free queue: none is left
    if max_reads is not None and num_read >= max_reads:
        raise OutOfReads
    data = group.disk.load(h, group.group)
    if data is None:
        return False
    block = pool.allocate()
    pool.register(block, h)
    held.append(block)
    loaded.append((block.block_id, data))
    group.from_disk[h] = block
    if len(group.from_disk) > pool.num_blocks:              # drop entries of evicted blocks
        group.from_disk = {k: b for k, b in group.from_disk.items() if b.block_hash == k}
    return True


def disk_tokens(groups, hashes: list[bytes], num_blocks: int, block_size: int) -> int:
    """Of a hit of num_blocks blocks (now in memory), the tokens memory would not have served
    without the blocks read back from disk and not used by a hit before; those blocks count
    as used from now on."""
    presents = [[p and group.from_disk.get(h) is not group.pool.lookup(h)
                 for p, h in zip(memory_present(group, hashes), hashes)] for group in groups]
    without = min(num_blocks, longest_hit(groups, presents))
    for group in groups:
        for i in group.needed(num_blocks):
            group.from_disk.pop(hashes[i], None)
    return (num_blocks - without) * block_size
