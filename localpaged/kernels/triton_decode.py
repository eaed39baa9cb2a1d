"""Triton paged decode attention: one query token per sequence, K/V read through the block table.

Owns ``paged_decode_attention`` (same signature as ``reference.paged_decode_attention``) and its
two variants:
- plain: one program per (sequence, KV head) walks the whole context;
- split-K (flash-decoding): one program per (sequence, KV head, partition of PARTITION_SIZE
  tokens) writes a partial output and its log-sum-exp, and a reduce kernel combines them.
The public function picks split-K when there are few (sequence, KV head) programs to fill the GPU
and the context is long; ``decode_plain`` and ``decode_split_k`` are callable directly for tests.

Sliding window W (``window``; 0: full attention): a sequence attends to its last W tokens,
[window_start, seq_len). The plain program starts its walk there; split-K numbers partitions from
the one holding window_start, so the grid is the window's partitions (about W / PARTITION_SIZE + 1)
rather than the table's. Table entries of blocks wholly before window_start are never loaded.

GQA: the ``group`` query heads sharing a KV head are the rows of one program's query tile, so
each K/V tile is loaded once per group. Rows are padded to GROUP_PAD >= 16 (tl.dot's minimum).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import reference
from .triton_common import (LOG2E, NEG_BIG, attend_tiles, compute_dtype, dot_options,
                            fallback_reason, log_fallback, next_pow2, scale_view)

PARTITION_SIZE = 256        # tokens per split-K partition; a multiple of every TILE_N used
_PLAIN_PARTITION = 1 << 30  # "one partition holds the whole context"
REDUCE_CHUNK = 32           # partitions the reduce kernel combines per step


@triton.jit
def _decode_kernel(q_ptr, k_cache, v_cache, k_words, v_words, tables, seq_lens, out_ptr, lse_ptr,
                   qk_scale, partition_size, window,
                   stride_qb, stride_qh, stride_tb, stride_kb, stride_ks, stride_kh,
                   stride_vb, stride_vs, stride_vh, stride_ob, stride_oh, stride_op,
                   stride_lb, stride_lh,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, TILE_N: tl.constexpr,
                   SPLIT: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr,
                   WINDOWED: tl.constexpr, INT8: tl.constexpr):
    """Program (b, kv_head, part): the GROUP query heads of kv_head over one partition.

    SPLIT=False: a single partition; writes the normalised output [B, H, D] in out's dtype.
    SPLIT=True: writes out[b, h, part] = partition output (fp32, normalised within the partition)
    and lse[b, h, part] = its log2-sum-exp2 (NEG_BIG for an empty partition).
    WINDOWED: partition `part` counts from the one holding the window's start, and the first
    starts at the window's start.
    """
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(seq_lens + b)
    if WINDOWED:
        first = tl.maximum(seq_len - window, 0)            # window_start
        start = (first // partition_size + part) * partition_size
        end = tl.minimum(start + partition_size, seq_len)
        start = tl.maximum(start, first)
    else:
        start = part * partition_size
        end = tl.minimum(start + partition_size, seq_len)   # end <= start: empty partition

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    offs_d = tl.arange(0, D_PAD)
    row_ok = rows < GROUP
    io_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=io_mask, other=0.0)
    if not INT8:                # a float cache's dtype; int8 rows are dequantized to q's
        q = q.to(k_cache.dtype.element_ty)

    acc = tl.zeros([GROUP_PAD, D_PAD], dtype=tl.float32)
    m_i = tl.full([GROUP_PAD], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    q_pos = tl.full([GROUP_PAD], 0, dtype=tl.int32) + (seq_len - 1)
    acc, m_i, l_i = attend_tiles(
        q, acc, m_i, l_i, k_cache + kv_head * stride_kh, v_cache + kv_head * stride_vh,
        tables + b * stride_tb, start, end, q_pos, q_pos, window, stride_kb, stride_ks, stride_vb,
        stride_vs, qk_scale, BLOCK_SIZE, HEAD_DIM, D_PAD, TILE_N, DOT_F32, PREC, False,
        k_words, v_words, kv_head * stride_kh, kv_head * stride_vh, INT8)

    l_safe = tl.where(l_i > 0, l_i, 1.0)   # an empty range leaves acc = 0, output 0
    out = acc / l_safe[:, None]
    o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + part * stride_op \
        + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=io_mask)
    if SPLIT:
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), NEG_BIG)
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + part, lse, mask=row_ok)


@triton.jit
def _reduce_kernel(part_out, part_lse, out_ptr, num_parts,
                   stride_pb, stride_ph, stride_pp, stride_lb, stride_lh, stride_ob, stride_oh,
                   PART_CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr):
    """Program (b, head): out = sum_p w_p * o_p / sum_p w_p with w_p = exp2(lse_p - max lse).

    Two passes over the partitions, PART_CHUNK at a time (registers stay bounded for any
    context): the max of the lse, then the weighted sum. Empty partitions (NEG_BIG) weigh 0.
    """
    b = tl.program_id(0)
    head = tl.program_id(1)
    offs_c = tl.arange(0, PART_CHUNK)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    lse_base = part_lse + b * stride_lb + head * stride_lh
    o_base = part_out + b * stride_pb + head * stride_ph
    run_max = tl.full([PART_CHUNK], NEG_BIG, dtype=tl.float32)
    for p0 in range(0, num_parts, PART_CHUNK):
        lse = tl.load(lse_base + p0 + offs_c, mask=p0 + offs_c < num_parts, other=NEG_BIG)
        run_max = tl.maximum(run_max, lse)
    lse_max = tl.max(run_max, 0)
    acc = tl.zeros([D_PAD], dtype=tl.float32)
    w_sum = tl.zeros([PART_CHUNK], dtype=tl.float32)
    for p0 in range(0, num_parts, PART_CHUNK):
        p_ok = p0 + offs_c < num_parts
        lse = tl.load(lse_base + p0 + offs_c, mask=p_ok, other=NEG_BIG)
        w = tl.where(p_ok, tl.exp2(lse - lse_max), 0.0)
        o = tl.load(o_base + (p0 + offs_c)[:, None] * stride_pp + offs_d[None, :],
                    mask=p_ok[:, None] & d_ok[None, :], other=0.0)
        acc += tl.sum(o * w[:, None], 0)
        w_sum += w
    out = acc / tl.sum(w_sum, 0)
    tl.store(out_ptr + b * stride_ob + head * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=d_ok)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 128


def use_split_k(batch: int, num_kv_heads: int, max_context: int, device: torch.device) -> bool:
    """Split when the plain grid (batch x KV heads) cannot fill the SMs and contexts are long."""
    return max_context >= 2 * PARTITION_SIZE and batch * num_kv_heads < _num_sms(device)


def default_tile_n(block_size: int, head_dim: int) -> int:
    """Keys per loop iteration: at least one cache block, at least 16 (tl.dot's minimum K)."""
    return max(block_size, 32 if next_pow2(head_dim) > 128 else 64)


def num_partitions(max_context: int, partition_size: int, window: int = 0) -> int:
    """Split-K partitions per (sequence, KV head): enough for max_context tokens, or with a
    window for any W consecutive positions (they touch at most cdiv(W, P) + 1 partitions)."""
    parts = max(1, triton.cdiv(max_context, partition_size))
    return min(parts, triton.cdiv(window, partition_size) + 1) if window else parts


def _prepare(q, k_cache, block_tables, seq_lens):
    q = q if q.stride(-1) == 1 else q.contiguous()
    tables = block_tables.to(device=q.device, dtype=torch.int32).contiguous()
    lens = seq_lens.to(device=q.device, dtype=torch.int32).contiguous()
    return q, tables, lens


def _launch(q, k_cache, v_cache, tables, lens, scale, out, lse, num_parts, partition_size,
            tile_n, window):
    batch, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    dot_f32, prec = dot_options(_decode_kernel, compute_dtype(q, k_cache))
    split = lse is not None
    lse_arg = lse if split else out
    stride_op = out.stride(2) if split else 0
    _decode_kernel[(batch, num_kv_heads, num_parts)](
        q, k_cache, v_cache, scale_view(k_cache), scale_view(v_cache), tables, lens, out, lse_arg,
        scale * LOG2E, partition_size, window,
        q.stride(0), q.stride(1), tables.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3],
        out.stride(0), out.stride(1), stride_op,
        lse_arg.stride(0), lse_arg.stride(1),
        GROUP=group, GROUP_PAD=max(16, next_pow2(group)), BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, D_PAD=next_pow2(head_dim), TILE_N=tile_n, SPLIT=split,
        DOT_F32=dot_f32, PREC=prec, WINDOWED=window > 0, INT8=k_cache.dtype == torch.int8)


def decode_plain(q, k_cache, v_cache, block_tables, seq_lens, scale, tile_n=None, window=0):
    """Plain variant: grid (B, Hkv); each program walks the whole context (its window)."""
    q, tables, lens = _prepare(q, k_cache, block_tables, seq_lens)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    tile_n = tile_n or default_tile_n(k_cache.shape[1], q.shape[2])
    _launch(q, k_cache, v_cache, tables, lens, scale, out, None, 1, _PLAIN_PARTITION, tile_n,
            window)
    return out


def decode_split_k(q, k_cache, v_cache, block_tables, seq_lens, scale,
                   partition_size=PARTITION_SIZE, tile_n=None, window=0):
    """Split-K variant: partitions sized ``partition_size`` (a multiple of tile_n), then reduce.

    The partition count comes from the block-table width, an upper bound on every seq_len that
    needs no device-to-host sync (with a window, from the window: `num_partitions`); partitions
    past a sequence's end are empty and weigh 0.
    """
    q, tables, lens = _prepare(q, k_cache, block_tables, seq_lens)
    batch, num_heads, head_dim = q.shape
    tile_n = tile_n or min(default_tile_n(k_cache.shape[1], head_dim), partition_size)
    assert partition_size % tile_n == 0, "a partition must be whole tiles"
    num_parts = num_partitions(tables.shape[1] * k_cache.shape[1], partition_size, window)
    part_out = torch.empty(batch, num_heads, num_parts, head_dim, dtype=torch.float32,
                           device=q.device)
    part_lse = torch.empty(batch, num_heads, num_parts, dtype=torch.float32, device=q.device)
    _launch(q, k_cache, v_cache, tables, lens, scale, part_out, part_lse, num_parts,
            partition_size, tile_n, window)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _reduce_kernel[(batch, num_heads)](
        part_out, part_lse, out, num_parts, *part_out.stride()[:3], *part_lse.stride()[:2],
        out.stride(0), out.stride(1),
        PART_CHUNK=min(REDUCE_CHUNK, max(2, next_pow2(num_parts))), HEAD_DIM=head_dim,
        D_PAD=next_pow2(head_dim))
    return out


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float, window: int = 0) -> torch.Tensor:
    """One query token per sequence: q [B, H, D] attends to its seq_len cached tokens (the last
    `window` of them with a window)."""
    reason = fallback_reason(_decode_kernel, q, q.shape[-1], (k_cache, v_cache))
    if reason is not None:
        log_fallback("paged_decode_attention", reason)
        return reference.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens,
                                                scale, window)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    max_context = block_tables.shape[1] * k_cache.shape[1]
    if window:                                  # what a sequence attends to, at most
        max_context = min(max_context, window)
    if use_split_k(q.shape[0], k_cache.shape[2], max_context, q.device):
        return decode_split_k(q, k_cache, v_cache, block_tables, seq_lens, scale, window=window)
    return decode_plain(q, k_cache, v_cache, block_tables, seq_lens, scale, window=window)
