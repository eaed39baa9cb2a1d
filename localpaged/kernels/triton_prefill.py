"""Triton paged prefill attention: a sequence's new tokens attend causally to its cached prefix
and to themselves, all read through the block table (their own K/V are already in the cache).

Owns ``paged_prefill_attention`` (same signature as ``reference.paged_prefill_attention``).
Flash-attention style: one program per (sequence, KV head, tile of BLOCK_Q new tokens) keeps an
online softmax over key tiles. GQA: the tile's rows are (token, query head of the group) pairs,
row = token * GROUP_PAD + head, so each K/V tile is loaded once for the whole group.

Positions: sequence i has q_len = query_start_loc[i+1] - query_start_loc[i] new tokens, the last
q_len of its seq_len tokens, so new token t sits at position seq_len - q_len + t and may see keys
at positions <= that. A program only walks keys up to its last token's position.

Sliding window W (``window``; 0: full attention): token at position p sees keys p - W < k <= p.
A program walks keys from its first token's window start (table entries of blocks wholly before
it are never loaded) and masks each row to its own window.

Runs of two-way attention (``open_runs``: Gemma 3's image tokens, as in the reference): a token
inside a run [lo, hi) also sees the run's later keys, up to hi - 1 (its window still counts from
its own position). The kernel takes each new token's last visible key (``reach``, built from the
runs on the host) and walks keys up to the furthest of its tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference
from .triton_common import (LOG2E, NEG_BIG, attend_tiles, compute_dtype, dot_options,
                            fallback_reason, log_fallback, next_pow2, scale_view)

BLOCK_M = 64   # rows (token x head pairs) per program for 16-bit caches, when the group allows


@triton.jit
def _prefill_kernel(q_ptr, k_cache, v_cache, k_words, v_words, tables, query_start_loc, seq_lens,
                    reach_ptr, out_ptr,
                    qk_scale, window,
                    stride_qt, stride_qh, stride_tb, stride_kb, stride_ks, stride_kh,
                    stride_vb, stride_vs, stride_vh, stride_ot, stride_oh,
                    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                    TILE_N: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr,
                    WINDOWED: tl.constexpr, INT8: tl.constexpr, OPEN: tl.constexpr):
    """Program (b, kv_head, q_tile): new tokens [q_tile * BLOCK_Q, +BLOCK_Q) of sequence b."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2)
    q_start = tl.load(query_start_loc + b)
    q_len = tl.load(query_start_loc + b + 1) - q_start
    seq_len = tl.load(seq_lens + b)
    first_tok = q_tile * BLOCK_Q
    if first_tok >= q_len:          # the grid is sized for the longest q_len in the batch
        return
    ctx_len = seq_len - q_len       # cached tokens before the new ones

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    tok = first_tok + rows // GROUP_PAD
    head_in_group = rows % GROUP_PAD
    offs_d = tl.arange(0, D_PAD)
    row_ok = (tok < q_len) & (head_in_group < GROUP)
    io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    heads = kv_head * GROUP + head_in_group
    row_off = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + row_off[:, None] * stride_qt + heads[:, None] * stride_qh
                + offs_d[None, :], mask=io_mask, other=0.0)
    if not INT8:                # a float cache's dtype; int8 rows are dequantized to q's
        q = q.to(k_cache.dtype.element_ty)

    acc = tl.zeros([BLOCK_Q * GROUP_PAD, D_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_Q * GROUP_PAD], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
    q_pos = ctx_len + tok
    end = tl.minimum(seq_len, ctx_len + first_tok + BLOCK_Q)   # last token's position + 1
    if OPEN:                        # a token in a run of two-way attention sees to its end
        reach = tl.load(reach_ptr + q_start + tok, mask=row_ok, other=0)
        reach = tl.maximum(reach, q_pos)
        end = tl.minimum(seq_len, tl.maximum(end, tl.max(tl.where(row_ok, reach, 0)) + 1))
    else:
        reach = q_pos
    if WINDOWED:                    # the first token's window start: the others' are later
        start = tl.maximum(ctx_len + first_tok - window + 1, 0)
    else:
        start = 0
    acc, m_i, l_i = attend_tiles(
        q, acc, m_i, l_i, k_cache + kv_head * stride_kh, v_cache + kv_head * stride_vh,
        tables + b * stride_tb, start, end, q_pos, reach, window, stride_kb, stride_ks, stride_vb,
        stride_vs, qk_scale, BLOCK_SIZE, HEAD_DIM, D_PAD, TILE_N, DOT_F32, PREC, WINDOWED,
        k_words, v_words, kv_head * stride_kh, kv_head * stride_vh, INT8)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + row_off[:, None] * stride_ot + heads[:, None] * stride_oh
             + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=io_mask)


def default_tiles(group_pad: int, block_size: int, head_dim: int, elem_size: int):
    """(BLOCK_Q, TILE_N). fp32 and head dims over 128 shrink the tiles, which keeps shared memory
    under ~100 KB (consumer GPUs) with Triton's default pipelining."""
    wide_dim = next_pow2(head_dim) > 128
    block_m = BLOCK_M // (1 + (elem_size >= 4)) // (1 + (elem_size >= 4 and wide_dim))
    return max(1, block_m // group_pad), max(block_size, 32 if elem_size >= 4 or wide_dim else 64)


def reach_of(open_runs: list[list[tuple[int, int]]], query_start_loc: torch.Tensor,
             seq_lens: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[T] int32: each new token's last visible key position beyond causality (its run's
    hi - 1 for a token inside a run [lo, hi), else -1: the kernel takes its own position)."""
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    reach = torch.full((starts[-1],), -1, dtype=torch.int32)
    for i, runs in enumerate(open_runs):
        first = lens[i] - (starts[i + 1] - starts[i])     # position of sequence i's first new token
        for lo, hi in runs:
            a, b = max(lo, first), min(hi, lens[i])
            if a < b:
                reach[starts[i] + a - first:starts[i] + b - first] = hi - 1
    return reach.to(device)


def prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
            block_q=None, tile_n=None, window=0, open_runs=None):
    """The kernel launch, with tile sizes exposed for tests. Syncs once to size the grid."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    device = q.device
    tables = block_tables.to(device=device, dtype=torch.int32).contiguous()
    starts = query_start_loc.to(device=device, dtype=torch.int32).contiguous()
    lens = seq_lens.to(device=device, dtype=torch.int32).contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    batch = lens.shape[0]
    if batch == 0 or q.shape[0] == 0:
        return out
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    group_pad = next_pow2(group)
    compute = compute_dtype(q, k_cache)
    default_q, default_n = default_tiles(group_pad, block_size, head_dim, compute.itemsize)
    block_q = max(block_q or default_q, triton.cdiv(16, group_pad))   # tl.dot needs >= 16 rows
    tile_n = tile_n or default_n
    max_q_len = int((starts[1:] - starts[:-1]).max())
    dot_f32, prec = dot_options(_prefill_kernel, compute)
    grid = (batch, num_kv_heads, triton.cdiv(max_q_len, block_q))
    opened = bool(open_runs) and any(open_runs)
    reach = reach_of(open_runs, starts.cpu(), lens.cpu(), device) if opened else lens
    _prefill_kernel[grid](
        q, k_cache, v_cache, scale_view(k_cache), scale_view(v_cache), tables, starts, lens,
        reach, out,
        scale * LOG2E, window,
        q.stride(0), q.stride(1), tables.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3],
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, D_PAD=next_pow2(head_dim), TILE_N=tile_n,
        DOT_F32=dot_f32, PREC=prec, WINDOWED=window > 0, INT8=k_cache.dtype == torch.int8,
        OPEN=opened)
    return out


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float, window: int = 0,
                            open_runs: list[list[tuple[int, int]]] | None = None) -> torch.Tensor:
    """New tokens attend causally to their sequence's cached prefix and to themselves (the last
    `window` positions up to their own, with a window; a run of `open_runs[i]` both ways).

    Sequence i owns queries q[query_start_loc[i]:query_start_loc[i+1]] ([T, H, D] overall); they
    are its last tokens, so the cache already holds all seq_lens[i] tokens (written by write_kv).
    """
    reason = fallback_reason(_prefill_kernel, q, q.shape[-1], (k_cache, v_cache))
    if reason is not None:
        log_fallback("paged_prefill_attention", reason)
        return reference.paged_prefill_attention(q, k_cache, v_cache, block_tables,
                                                 query_start_loc, seq_lens, scale, window,
                                                 open_runs=open_runs)
    return prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                   window=window, open_runs=open_runs)
