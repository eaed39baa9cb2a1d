"""Pieces shared by the Triton attention kernels: the online-softmax loop over paged K/V, and
the host-side checks that decide whether a call can run in Triton at all.

Conventions for every kernel in this package:
- caches are ``[num_blocks, block_size, num_kv_heads, head_dim]`` with a unit stride on the last
  dimension; a token at logical position ``pos`` of a sequence lives in physical block
  ``table[pos // block_size]`` at offset ``pos % block_size``;
- softmax runs in the log2 domain: scores are multiplied by ``scale * log2(e)`` and exponentiated
  with ``exp2``; statistics and accumulators are fp32 whatever the input dtype;
- a head dim is padded to a power of two (``D_PAD``) and masked, so 80 or 96 work as well as 128;
- KV cache dtypes (kernels/kv_quant.py): a float cache computes in its own dtype (q is cast to
  it); an int8 cache (rows of D int8 values then a float32 scale) computes in q's dtype, each
  K/V row loaded as float32(q) * scale (the reference's dequantized value) and cast to it.
  ``INT8`` is a constexpr, so the float caches compile with no int8 code in them; the scales are
  read through a float32 view of the same cache (``scale_view``);
- sliding window W: the query at position p sees keys p - W < k <= p. A kernel takes W as a
  runtime argument and ``WINDOWED`` (W > 0) as a constexpr, so full attention compiles with no
  window code in it; a windowed loop starts at the first window's block, so table entries of
  blocks wholly before it (which may hold any block id) are never loaded.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)

LOG2E = 1.4426950408889634
# Finite "minus infinity" for running maxima: exp2(NEG_BIG - m) is exactly 0 and, unlike -inf,
# NEG_BIG - NEG_BIG is 0 rather than NaN when a whole tile is masked.
NEG_BIG = tl.constexpr(-1.0e30)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
_logged: set[tuple[str, str]] = set()


def scale_view(cache: torch.Tensor) -> torch.Tensor:
    """The cache as float32 words (an int8 cache: its row scales sit at word (row + D) / 4 of
    each row); any other cache as itself (never read: INT8 is off)."""
    return cache.view(torch.float32) if cache.dtype == torch.int8 else cache


def compute_dtype(q: torch.Tensor, cache: torch.Tensor) -> torch.dtype:
    """The dtype the attention kernels compute in: the cache's, or q's for an int8 cache."""
    return q.dtype if cache.dtype == torch.int8 else cache.dtype


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` was decorated under TRITON_INTERPRET=1 (it then runs on CPU tensors)."""
    return not isinstance(kernel, triton.runtime.JITFunction)


def fallback_reason(kernel, tensor: torch.Tensor, head_dim: int | None = None,
                    caches: tuple[torch.Tensor, ...] = ()) -> str | None:
    """Why this call cannot run in Triton (None when it can)."""
    if not (tensor.is_cuda or is_interpreted(kernel)):
        return f"tensors on {tensor.device} and TRITON_INTERPRET is off"
    if head_dim is not None and not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        return f"head_dim {head_dim} outside [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    if any(cache.stride(-1) != 1 for cache in caches):
        return "a cache's last dimension is not contiguous"
    return None


def log_fallback(op: str, reason: str) -> None:
    """One info line per (op, reason) for the life of the process, not one per layer and step."""
    if (op, reason) not in _logged:
        _logged.add((op, reason))
        logger.info("triton %s falls back to the torch reference: %s", op, reason)


def dot_options(kernel, dtype: torch.dtype) -> tuple[bool, str]:
    """(DOT_F32, PREC) constexprs for ``attend_tiles``.

    fp32 inputs use IEEE dots (not TF32) so fp32 results match the reference closely. The
    interpreter's dot multiplies bf16 bit patterns as integers, so there bf16 dots are upcast.
    """
    dot_f32 = dtype == torch.bfloat16 and is_interpreted(kernel)
    prec = "ieee" if dtype == torch.float32 or dot_f32 else "tf32"
    return dot_f32, prec


@triton.jit
def _dot(a, b, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    if DOT_F32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def load_rows(base, words, row, head, mask, kv_mask, offs_d, dtype, HEAD_DIM: tl.constexpr,
              INT8: tl.constexpr):
    """Cached rows at element offsets `row` ([N]) from base (the cache + `head`, its KV head's
    offset) as [N, D_PAD] of dtype; INT8: q from base, each row's float32 scale from `words`
    (the whole cache as float32 words) at word (head + row + D) / 4."""
    x = tl.load(base + row[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    if INT8:
        s = tl.load(words + (head + row + HEAD_DIM) // 4, mask=mask, other=0.0)
        x = x.to(tl.float32) * s[:, None]
    return x.to(dtype)


@triton.jit
def attend_tiles(q, acc, m_i, l_i, k_base, v_base, table_row, start, end, q_pos, reach, window,
                 stride_kb, stride_ks, stride_vb, stride_vs, qk_scale,
                 BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                 TILE_N: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr,
                 WINDOWED: tl.constexpr, k_words, v_words, head_k, head_v, INT8: tl.constexpr):
    """Fold keys/values at positions [start, end) into the running softmax state of the rows of q.

    q: [M, D_PAD] in the cache dtype; acc: [M, D_PAD] fp32, unnormalised output; m_i: [M] fp32
    running max of log2-domain scores; l_i: [M] fp32 running sum of exp2(score - m_i).
    k_base/v_base already point at the KV head; table_row at the sequence's block-table row.
    Row r may see key position p only if p <= reach[r] (its own position q_pos[r], causality;
    decode passes seq_len - 1; or the last position of a run of two-way attention it is in)
    and, with WINDOWED, p > q_pos[r] - window (rows whose windows start at or before `start`,
    as decode's single row, need no WINDOWED: the loop starts there).
    Positions outside [start, end) are never loaded, so padding table entries, unwritten slots
    and blocks before the window are not read.
    INT8: k_words/v_words are the caches as float32 (scale_view) at their start, head_k/head_v
    the KV head's element offset (k_base = cache + head_k).
    """
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + offs_n
        in_range = pos < end
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
        in_block = (pos % BLOCK_SIZE).to(tl.int64)
        kv_mask = in_range[:, None] & d_ok[None, :]
        k = load_rows(k_base, k_words, block * stride_kb + in_block * stride_ks, head_k, in_range,
                      kv_mask, offs_d, q.dtype, HEAD_DIM, INT8)
        s = _dot(q, tl.trans(k), DOT_F32, PREC) * qk_scale       # [M, TILE_N]
        visible = in_range[None, :] & (pos[None, :] <= reach[:, None])
        if WINDOWED:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_rows(v_base, v_words, block * stride_vb + in_block * stride_vs, head_v, in_range,
                      kv_mask, offs_d, q.dtype, HEAD_DIM, INT8)
        acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v, DOT_F32, PREC)
        m_i = m_new
    return acc, m_i, l_i
