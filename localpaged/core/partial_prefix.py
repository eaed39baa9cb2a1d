"""Prefix hits inside a block: the tokens a new sequence shares with a cached full block's start.

The prefix cache finds whole blocks by the chain hash of their tokens (core.prefix_cache), so a
sequence that leaves a cached path in the middle of a block (a reply forked at one of its tokens,
a message edited after its first words) would recompute that block's first tokens. Here the
cached full blocks are also indexed by their parent's hash: at the first block a sequence does
not find whole, the cached block under the same parent whose tokens begin like the sequence's
gives its first `num_tokens` slots. The sequence gets a private copy of it (a COPY op, carried
out before the next forward like a copy-on-write), never the shared block itself, and computes
only the rest: a reply forked at a token needs one decode step, not a prefill.

Invariants:
- `TailHit.num_tokens` >= 1, and the block's tokens 0 .. num_tokens-1 equal the sequence's at
  those positions; the K/V of a slot depend only on the tokens up to it, so the copied slots
  hold exactly what the sequence would compute there.
- The index may name blocks the pool has since evicted: a lookup checks the pool, and the index
  is pruned of them when it outgrows the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from localpaged.core.block_pool import Block, BlockPool

ROOT = b""            # the parent key of a sequence's first block


@dataclass(frozen=True)
class TailHit:
    """The first `num_tokens` slots of cached `block` are the sequence's next tokens."""
    block: Block
    num_tokens: int


class PrefixHit(list):
    """A prefix hit: the cached full blocks (a list of Block, as before), and where the sequence
    leaves them mid-block, the tail hit that follows them."""

    def __init__(self, blocks: list[Block] = (), tail: TailHit | None = None) -> None:
        super().__init__(blocks)
        self.tail = tail


def tail_of(hits: list[Block]) -> TailHit | None:
    """The tail hit of a prefix hit, if it has one."""
    return hits.tail if isinstance(hits, PrefixHit) else None


class TailIndex:
    """Cached full blocks by their parent's chain hash: parent -> {block hash: its tokens}."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.children: dict[bytes, dict[bytes, tuple[int, ...]]] = {}
        self.size = 0

    def add(self, parent: bytes | None, block_hash: bytes, token_ids: list[int]) -> None:
        """Index a block just registered in the pool's prefix cache."""
        siblings = self.children.setdefault(parent or ROOT, {})
        if block_hash not in siblings:
            siblings[block_hash] = tuple(token_ids)
            self.size += 1
            if self.size > 2 * self.pool.num_blocks:
                self.prune()

    def find(self, parent: bytes | None, token_ids: list[int]) -> TailHit | None:
        """The cached block under `parent` sharing the longest start with token_ids (at least
        one token), or None."""
        best, best_len = None, 0
        for block_hash, tokens in self.children.get(parent or ROOT, {}).items():
            n = _common_start(tokens, token_ids)
            if n > best_len:
                block = self.pool.lookup(block_hash)
                if block is not None:
                    best, best_len = block, n
        return TailHit(best, best_len) if best is not None else None

    def prune(self) -> None:
        """Forget the blocks the pool no longer caches."""
        for parent in list(self.children):
            siblings = {h: t for h, t in self.children[parent].items() if self.pool.lookup(h)}
            if siblings:
                self.children[parent] = siblings
            else:
                del self.children[parent]
        self.size = sum(len(s) for s in self.children.values())

    def clear(self) -> None:
        self.children.clear()
        self.size = 0


def _common_start(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
