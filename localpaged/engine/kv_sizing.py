"""How many KV blocks each KV-cache group gets (device and CPU swap), from the memory budget or
EngineConfig.num_kv_blocks.

The rule (every group's pool is sized at start-up, once):
- A sliding-window group of window W needs, for a running sequence between steps, the blocks
  overlapping its window (at most cdiv(W, B) + 1), plus during a step the blocks of the tokens
  it computes (a prefill chunk: at most cdiv(n, B) + 1). The step's tokens over all sequences
  are at most max_num_batched_tokens, so the group never needs more than
  `sliding_blocks_needed` = max_num_seqs * (cdiv(W, B) + 2) + cdiv(max_num_batched_tokens, B).
  It gets that, capped at the blocks it would get without a window (the budget spread evenly
  over every layer), so a window never costs memory.
- Group 0 (the full-attention group, or the only group) gets the rest of the budget: the memory
  the windows save goes to full attention's context and to more sequences.
- With num_kv_blocks set, it is group 0's block count (the only group's, for a model without
  windows: today's meaning), and each other group gets the same rule capped at num_kv_blocks.
- CPU swap space is split between the groups in proportion to their device bytes.
A model with one full-attention group gets exactly what it got before groups existed.
"""

from __future__ import annotations

from dataclasses import dataclass

from localpaged.models.layer_types import KVGroups


@dataclass(frozen=True)
class KVPlan:
    """Per KV-cache group g: windows[g], num_blocks[g], num_cpu_blocks[g] and the bytes of one of
    its blocks over all its layers (bytes_per_block[g])."""
    windows: tuple[int, ...]
    num_blocks: list[int]
    num_cpu_blocks: list[int]
    bytes_per_block: list[int]

    def describe(self, block_size: int) -> str:
        parts = []
        for w, n, c, b in zip(self.windows, self.num_blocks, self.num_cpu_blocks, self.bytes_per_block):
            kind = f"window {w}" if w else "full attention"
            parts.append(f"{kind}: {n} blocks ({n * block_size} tokens, {n * b / 2**20:.1f} MiB)"
                         + (f", {c} CPU" if c else ""))
        return "; ".join(parts)


def sliding_blocks_needed(window: int, block_size: int, max_num_seqs: int,
                          max_num_batched_tokens: int) -> int:
    """The most blocks a sliding group with this window can hold at once (see the module doc)."""
    def blocks(tokens: int) -> int:
        return -(-tokens // block_size)
    return max_num_seqs * (blocks(window) + 2) + blocks(max_num_batched_tokens)


def plan(groups: KVGroups, layer_block_bytes: int, block_size: int, max_num_seqs: int,
         max_num_batched_tokens: int, num_kv_blocks: int | None, budget: float | None,
         swap_bytes: float) -> KVPlan:
    """The pools of every group. `layer_block_bytes`: one block of one layer (K and V);
    `budget`: device bytes for the KV cache when num_kv_blocks is None; `swap_bytes`: CPU bytes
    for swap (0: none). Raises ValueError when group 0 gets no block."""
    per_block = [len(groups.layers(g)) * layer_block_bytes for g in range(groups.num_groups)]
    if num_kv_blocks is not None:
        cap = num_kv_blocks
    else:
        cap = int(budget // sum(per_block))        # every group's share without windows
    blocks = [0] + [min(sliding_blocks_needed(w, block_size, max_num_seqs, max_num_batched_tokens),
                        cap) for w in groups.windows[1:]]
    if num_kv_blocks is not None:
        blocks[0] = num_kv_blocks
    else:
        rest = budget - sum(n * b for n, b in zip(blocks, per_block))
        blocks[0] = int(rest // per_block[0])
    if min(blocks) < 1:
        raise ValueError(f"the KV cache budget holds no block of {per_block[0]:,} bytes for "
                         f"group 0")
    total = sum(n * b for n, b in zip(blocks, per_block))
    cpu = [int(swap_bytes * (n * b / total) // b) for n, b in zip(blocks, per_block)]
    return KVPlan(groups.windows, blocks, cpu, per_block)
