"""Plain-torch reference implementations of the paged-attention kernels.

These are the CPU path of the engine and the ground truth the Triton kernels in this package are
tested against. Every function here has the same signature as its Triton twin.

Cache layout (one tensor per layer for K and one for V):
    cache[num_blocks, block_size, num_kv_heads, head_dim]
A token's slot is ``block_id * block_size + offset``; a block table row lists the physical block
ids of a sequence's logical blocks in order (padding entries are never read past ``seq_len``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store key/value [T, Hkv, D] into their slots; a negative slot means "skip this token"."""
    num_blocks, block_size = k_cache.shape[:2]
    slots = slot_mapping.long()
    if bool((slots < 0).any()):
        keep = slots >= 0
        key, value, slots = key[keep], value[keep], slots[keep]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:]).index_copy_(0, slots, key.to(k_cache.dtype))
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:]).index_copy_(0, slots, value.to(v_cache.dtype))


def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` cached tokens of one sequence, [length, Hkv, D]."""
    num_blocks = -(-length // cache.shape[1])
    return cache[block_table[:num_blocks].long()].flatten(0, 1)[:length]


DECODE_CHUNK = 16     # sequences per gather: sorted by length, so padding stays small


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """One query token per sequence: q [B, H, D] attends to its seq_len cached tokens.

    Sequences are gathered in chunks of similar length, each padded to its own longest.
    """
    if q.shape[0] <= DECODE_CHUNK:
        return _decode_padded(q, k_cache, v_cache, block_tables, seq_lens, scale)
    out = torch.empty_like(q)
    for chunk in seq_lens.argsort().split(DECODE_CHUNK):
        out[chunk] = _decode_padded(q[chunk], k_cache, v_cache, block_tables[chunk],
                                    seq_lens[chunk], scale)
    return out


def _decode_padded(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    batch, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    max_len = int(seq_lens.max())
    table = block_tables[:, :-(-max_len // block_size)].long()
    # [B, blocks, B_size, Hkv, D] -> [B, Hkv, L, D]; padding entries are masked below.
    keys = k_cache[table].flatten(1, 2)[:, :max_len].transpose(1, 2).to(q.dtype)
    values = v_cache[table].flatten(1, 2)[:, :max_len].transpose(1, 2).to(q.dtype)
    group = num_heads // num_kv_heads
    qg = q.view(batch, num_kv_heads, group, head_dim)
    valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].to(q.device)
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=valid[:, None, None, :],
                                         scale=scale)
    return out.reshape(batch, num_heads, head_dim)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """New tokens attend causally to their sequence's cached prefix and to themselves.

    Sequence i owns queries q[query_start_loc[i]:query_start_loc[i+1]] ([T, H, D] overall); they
    are its last tokens, so the cache already holds all seq_lens[i] tokens (written by write_kv).
    """
    out = torch.empty_like(q)
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        lo, hi = starts[i], starts[i + 1]
        q_len = hi - lo
        if q_len == 0:
            continue
        group = num_heads // num_kv_heads        # expanded K/V: much faster than enable_gqa on CPU
        keys = _gather(k_cache, block_tables[i], seq_len).to(q.dtype).repeat_interleave(group, 1)
        values = _gather(v_cache, block_tables[i], seq_len).to(q.dtype).repeat_interleave(group, 1)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
        attn = F.scaled_dot_product_attention(q[lo:hi].transpose(0, 1), keys.transpose(0, 1),
                                              values.transpose(0, 1), attn_mask=mask, scale=scale)
        out[lo:hi] = attn.transpose(0, 1)
    return out


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """dst[block_mapping[p, 1]] = src[block_mapping[p, 0]] for every pair p.

    src and dst share a device and a block shape; they may be the same tensor (copy-on-write).
    Swapping between devices stages through a contiguous buffer (see localpaged.kv_cache).
    """
    if block_mapping.numel() == 0:
        return
    mapping = block_mapping.to(src.device).long()
    dst[mapping[:, 1]] = src[mapping[:, 0]]
