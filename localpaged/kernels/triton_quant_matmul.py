"""Triton weight-only quantized matmul: y = x @ w.T with w kept packed (int8 or int4).

Owns ``quant_matmul(x, qweight, scales, mins, group_size, bits)``; layouts and the ground truth
are in ``quant_reference``. Two kernels, picked by the row count M of x:
- decode (M <= DECODE_MAX_M): GEMV-like. Program (n block, k split) loops over its share of K;
  the M rows (padded to a power of two, no tl.dot minimum) multiply the weight tile by
  broadcast-and-sum. Split-K (partials in fp32, summed after) fills the GPU when N is narrow;
- prefill (M > DECODE_MAX_M): tiled GEMM, program (m block, n block), tl.dot per K tile.

Invariants of both kernels:
- a K tile never straddles two int4 groups (SUB_K divides G), so the integer tile is multiplied
  first and scaled after: y += s * (x . q) + m * sum(x), with q exact in every activation dtype
  (|q| <= 128) and fp32 accumulation;
- int4 tiles are read as bytes [BLOCK_N, SUB_K // 2]; the low nibbles meet the even columns of
  x and the high nibbles the odd ones, so nibbles are never interleaved in registers;
- rows >= M, columns >= N and k >= K are masked; x must have a unit stride along K;
- weight row offsets are int64 (N * K may pass 2**31 for a large vocabulary's lm_head).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .quant_reference import check_quant_args, quant_matmul_reference
from .triton_common import _dot, dot_options, fallback_reason, log_fallback, next_pow2
from .triton_decode import _num_sms

DECODE_MAX_M = 16
DECODE_TILE_BUDGET = 4096   # broadcast-sum products [BLOCK_M, BLOCK_N, SUB_K] per iteration


@triton.jit
def _mm(x, q, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    """x [BM, BK] (activation dtype) times q [BN, BK] (integers) transposed -> [BM, BN] fp32."""
    if USE_DOT:   # (the interpreter's int -> bf16 casts are wrong too: DOT_F32 skips them)
        return _dot(x, tl.trans(q.to(tl.float32 if DOT_F32 else x.dtype)), DOT_F32, PREC)
    return tl.sum(x.to(tl.float32)[:, None, :] * q.to(tl.float32)[None, :, :], axis=2)


@triton.jit
def _tile(x_ptr, q_ptr, s_ptr, mn_ptr, offs_m, offs_n, k0, M, N, K,
          stride_xm, stride_qn, stride_sn,
          GROUP: tl.constexpr, BITS: tl.constexpr, SUB_K: tl.constexpr,
          USE_DOT: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    """The [BM, BN] fp32 contribution of the K tile [k0, k0 + SUB_K) to y (0 when k0 >= K)."""
    m_ok = offs_m < M
    n_ok = offs_n < N
    if BITS == 8:
        offs_k = k0 + tl.arange(0, SUB_K)
        k_ok = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        q = tl.load(q_ptr + offs_n.to(tl.int64)[:, None] * stride_qn + offs_k[None, :],
                    mask=n_ok[:, None] & k_ok[None, :], other=0)
        s = tl.load(s_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        return _mm(x, q, USE_DOT, DOT_F32, PREC) * s[None, :]
    else:
        offs_j = k0 // 2 + tl.arange(0, SUB_K // 2)             # byte columns of the tile
        j_ok = offs_j < K // 2
        x_mask = m_ok[:, None] & j_ok[None, :]
        x_rows = x_ptr + offs_m[:, None] * stride_xm + 2 * offs_j[None, :]
        x_even = tl.load(x_rows, mask=x_mask, other=0.0)
        x_odd = tl.load(x_rows + 1, mask=x_mask, other=0.0)
        packed = tl.load(q_ptr + offs_n.to(tl.int64)[:, None] * stride_qn + offs_j[None, :],
                         mask=n_ok[:, None] & j_ok[None, :], other=0)
        low = packed & 0x0F
        high = packed >> 4
        dot = _mm(x_even, low, USE_DOT, DOT_F32, PREC) + _mm(x_odd, high, USE_DOT, DOT_F32, PREC)
        x_sum = tl.sum(x_even.to(tl.float32) + x_odd.to(tl.float32), axis=1)
        g_ptr = offs_n * stride_sn + k0 // GROUP                # one group per tile
        g_ok = n_ok & (offs_n * 0 + k0 < K)                    # past K: no group to read
        s = tl.load(s_ptr + g_ptr, mask=g_ok, other=0.0).to(tl.float32)
        mn = tl.load(mn_ptr + g_ptr, mask=g_ok, other=0.0).to(tl.float32)
        return dot * s[None, :] + x_sum[:, None] * mn[None, :]


@triton.jit
def _k_range(acc, x_ptr, q_ptr, s_ptr, mn_ptr, offs_m, offs_n, k_start, k_end, M, N, K,
             stride_xm, stride_qn, stride_sn,
             GROUP: tl.constexpr, BITS: tl.constexpr, SUB_K: tl.constexpr,
             UNROLL: tl.constexpr, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr,
             PREC: tl.constexpr):
    """acc += the contribution of k in [k_start, k_end), UNROLL one-group tiles per iteration
    (their loads issue together; tiles at or past K contribute 0)."""
    for k0 in range(k_start, k_end, SUB_K * UNROLL):
        for u in tl.static_range(UNROLL):
            acc += _tile(x_ptr, q_ptr, s_ptr, mn_ptr, offs_m, offs_n, k0 + u * SUB_K, M, N, K,
                         stride_xm, stride_qn, stride_sn, GROUP, BITS, SUB_K, USE_DOT,
                         DOT_F32, PREC)
    return acc


@triton.jit
def _decode_kernel(x_ptr, q_ptr, s_ptr, mn_ptr, y_ptr, M, N, K, k_per_split,
                   stride_xm, stride_qn, stride_sn, stride_ys, stride_ym,
                   GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, SUB_K: tl.constexpr, UNROLL: tl.constexpr,
                   USE_DOT: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    """Program (n block, split): all M rows (M <= BLOCK_M) over k in [split * k_per_split, +
    k_per_split) (k_per_split a multiple of SUB_K * UNROLL). y is [SPLITS, M, N] fp32 partials,
    or [M, N] in x's dtype (stride_ys 0). USE_DOT: tl.dot (BLOCK_M >= 16), else broadcast-sum."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = _k_range(acc, x_ptr, q_ptr, s_ptr, mn_ptr, offs_m, offs_n, k_start, k_end, M, N, K,
                   stride_xm, stride_qn, stride_sn, GROUP, BITS, SUB_K, UNROLL, USE_DOT,
                   DOT_F32, PREC)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    y = y_ptr + pid_k * stride_ys + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _prefill_kernel(x_ptr, q_ptr, s_ptr, mn_ptr, y_ptr, M, N, K,
                    stride_xm, stride_qn, stride_sn, stride_ym,
                    GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, SUB_K: tl.constexpr, UNROLL: tl.constexpr,
                    DOT_F32: tl.constexpr, PREC: tl.constexpr):
    """Program (m block, n block): the [BLOCK_M, BLOCK_N] tile of y over the whole of K."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = _k_range(acc, x_ptr, q_ptr, s_ptr, mn_ptr, offs_m, offs_n, 0, K, M, N, K,
                   stride_xm, stride_qn, stride_sn, GROUP, BITS, SUB_K, UNROLL, True,
                   DOT_F32, PREC)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask)


def _sub_k(bits: int, group_size: int | None, K: int, wanted: int) -> int:
    """The one-group tile width: a power of two <= wanted that divides G for int4 (so a tile
    stays in one group) and >= 32 for int4 (each nibble half >= 16, tl.dot's minimum K)."""
    cap = min(wanted, group_size) if bits == 4 else wanted
    return max(32 if bits == 4 else 16, min(cap, next_pow2(K)))


def decode_config(M: int, N: int, K: int, bits: int, group_size: int | None,
                  device: torch.device) -> dict:
    """Tiles and split count of the decode kernel (M <= DECODE_MAX_M).

    M <= 4: broadcast-sum, 256 k per iteration and DECODE_TILE_BUDGET products, so few rows
    per program (16 at M=1) and N alone gives many programs; M in 5..16: tl.dot on 16 rows.
    Split-K adds programs until there are ~4 per SM, each split keeping >= 2 iterations.
    """
    use_dot = M > 4
    block_m = 16 if use_dot else next_pow2(M)
    sub_k = _sub_k(bits, group_size, K, 128 if bits == 4 else 256)
    unroll = max(1, min(256 // sub_k, next_pow2(K) // sub_k)) if bits == 4 else 1
    block_n = 64 if use_dot else max(4, DECODE_TILE_BUDGET // (block_m * sub_k * unroll))
    n_blocks = triton.cdiv(N, block_n)
    k_iters = triton.cdiv(K, sub_k * unroll)
    sms = _num_sms(device) if device.type == "cuda" else 0    # interpreter: split if asked
    split = max(1, min(4 * sms // n_blocks, k_iters // 2))
    return dict(block_m=block_m, block_n=block_n, sub_k=sub_k, unroll=unroll, split_k=split,
                use_dot=use_dot)


def prefill_config(M: int, bits: int, group_size: int | None, K: int) -> dict:
    """Tiles of the GEMM kernel: 64 k per iteration (two or more one-group tiles for G = 32)."""
    big = M >= 256
    sub_k = _sub_k(bits, group_size, K, 64)
    return dict(block_m=128 if big else (32 if M <= 32 else 64), block_n=128 if big else 64,
                sub_k=sub_k, unroll=max(1, 64 // sub_k), num_warps=8 if big else 4)


def _prepare(x, qweight, scales, mins):
    """Unit stride along K for x and qweight; scales and mins contiguous, hence with the same
    row stride (the kernels index both with stride_sn)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    qweight = qweight if qweight.stride(-1) == 1 else qweight.contiguous()
    return x, qweight, scales.contiguous(), None if mins is None else mins.contiguous()


def quant_decode(x, qweight, scales, mins, group_size, bits, block_n=None, sub_k=None,
                 unroll=None, split_k=None) -> torch.Tensor:
    """The decode kernel (any M <= 16); None tile arguments take ``decode_config``'s choice."""
    M, N, K = check_quant_args(x, qweight, scales, mins, group_size, bits)
    x, qweight, scales, mins = _prepare(x, qweight, scales, mins)
    if M > DECODE_MAX_M:
        raise ValueError(f"the decode kernel takes M <= {DECODE_MAX_M} rows, got M={M}")
    cfg = decode_config(M, N, K, bits, group_size, x.device)
    block_n, split_k = block_n or cfg["block_n"], split_k or cfg["split_k"]
    sub_k, unroll = sub_k or cfg["sub_k"], unroll or cfg["unroll"]
    k_iters = triton.cdiv(K, sub_k * unroll)
    split_k = min(split_k, k_iters)
    k_per_split = triton.cdiv(k_iters, split_k) * sub_k * unroll
    split_k = triton.cdiv(K, k_per_split)                       # no empty splits
    if split_k > 1:
        y = torch.empty(split_k, M, N, dtype=torch.float32, device=x.device)
    else:
        y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    dot_f32, prec = dot_options(_decode_kernel, x.dtype)
    mn = mins if mins is not None else scales                   # unused for int8
    _decode_kernel[(triton.cdiv(N, block_n), split_k)](
        x, qweight, scales, mn, y, M, N, K, k_per_split,
        x.stride(0), qweight.stride(0), scales.stride(0), y.stride(0) if split_k > 1 else 0,
        y.stride(-2), GROUP=group_size or 1, BITS=bits, BLOCK_M=cfg["block_m"],
        BLOCK_N=block_n, SUB_K=sub_k, UNROLL=unroll, USE_DOT=cfg["use_dot"], DOT_F32=dot_f32,
        PREC=prec)
    return y.sum(0).to(x.dtype) if split_k > 1 else y


def quant_prefill(x, qweight, scales, mins, group_size, bits, block_m=None, block_n=None,
                  sub_k=None, unroll=None) -> torch.Tensor:
    """The tiled-GEMM kernel (any M); None tile arguments take ``prefill_config``'s choice."""
    M, N, K = check_quant_args(x, qweight, scales, mins, group_size, bits)
    x, qweight, scales, mins = _prepare(x, qweight, scales, mins)
    cfg = prefill_config(M, bits, group_size, K)
    block_m, block_n = block_m or cfg["block_m"], block_n or cfg["block_n"]
    sub_k, unroll = sub_k or cfg["sub_k"], unroll or cfg["unroll"]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    dot_f32, prec = dot_options(_prefill_kernel, x.dtype)
    mn = mins if mins is not None else scales
    _prefill_kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
        x, qweight, scales, mn, y, M, N, K, x.stride(0), qweight.stride(0), scales.stride(0),
        y.stride(0), GROUP=group_size or 1, BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n,
        SUB_K=sub_k, UNROLL=unroll, DOT_F32=dot_f32, PREC=prec, num_warps=cfg["num_warps"])
    return y


def quant_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 mins: torch.Tensor | None, group_size: int | None, bits: int) -> torch.Tensor:
    """y [M, N] = x [M, K] @ w.T in x.dtype (fp32 accumulation), w packed as in quant_reference.

    CPU tensors without TRITON_INTERPRET fall back to the reference (one info log line).
    """
    check_quant_args(x, qweight, scales, mins, group_size, bits)
    reason = fallback_reason(_decode_kernel, x)
    if reason is not None:
        log_fallback("quant_matmul", reason)
        return quant_matmul_reference(x, qweight, scales, mins, group_size, bits)
    if x.shape[0] == 0 or qweight.shape[0] == 0:
        return torch.zeros(x.shape[0], qweight.shape[0], dtype=x.dtype, device=x.device)
    if x.shape[0] <= DECODE_MAX_M:
        return quant_decode(x, qweight, scales, mins, group_size, bits)
    return quant_prefill(x, qweight, scales, mins, group_size, bits)
