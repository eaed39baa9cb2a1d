"""Triton matmul over llama.cpp's block formats as GGUF stores them: y = x @ dequantize(w).T,
with w the file's bytes, uint8 [N, row_bytes] (layouts: kernels/ggml_reference.py, the ground
truth these kernels are tested against under TRITON_INTERPRET=1).

Owns ``ggml_matmul(x, data, type_id)`` and ``SUPPORTED`` (the GGML type ids it reads: all twelve
block formats of ggml_reference.FORMATS). Each K tile is one 32-element chunk of a row: a whole
block of the 32-element formats, one sub-block (Q4_K, Q5_K, IQ4_XS) or two (Q2_K, Q3_K, Q6_K) of
a 256-element super-block. A program dequantizes its [BLOCK_N, 32] weight tile in registers
(bytes gathered, bits shifted out, scales applied in float32) and multiplies it with the
[BLOCK_M, 32] tile of x:
- M <= DOT_MIN_M: broadcast-and-sum (no tl.dot minimum of 16 rows), many narrow programs over N,
  as a GEMV wants;
- larger M: tl.dot on [BLOCK_M, 32] x [32, BLOCK_N] tiles, a tiled GEMM (prefill).

Invariants: a tile never straddles a block boundary (32 divides every block); rows >= M and
columns >= N are masked, K is whole blocks (checked on the host); weight row offsets are int64
(a 151,936-row lm_head passes 2**31 bytes); accumulation is float32 whatever x's dtype.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .ggml_reference import (FORMATS, IQ4_NL_VALUES, BlockFormat, dequantize, format_for_type_id,
                             row_bytes)
from .triton_common import _dot, dot_options, fallback_reason, log_fallback, next_pow2

SUPPORTED = frozenset(f.type_id for f in FORMATS.values())
DOT_MIN_M = 8          # above this many rows of x: tl.dot tiles; at or below: broadcast-and-sum
CHUNK = 32             # elements per K tile

# GGML type numbers (ggml_reference.FORMATS), read inside the kernels. Compiled Triton reads a
# global only when it is a tl.constexpr (the interpreter reads any: triton_compile_check.py
# compiles every format on a machine without a GPU).
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = (tl.constexpr(FORMATS[k].type_id)
                                for k in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"))
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (tl.constexpr(FORMATS[k].type_id)
                                for k in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
IQ4_NL, IQ4_XS = (tl.constexpr(FORMATS[k].type_id) for k in ("IQ4_NL", "IQ4_XS"))


@triton.jit
def _byte(ptr, mask):
    """Bytes at ptr as int32 (0 where masked)."""
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _sbyte(ptr, mask):
    """Bytes at ptr read as int8, then float32 (0 where masked)."""
    return tl.load(ptr, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _fp16(ptr, mask):
    """The little-endian fp16 at ptr (a byte pointer), as float32."""
    bits = _byte(ptr, mask) | (_byte(ptr + 1, mask) << 8)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k4_scale_min(s, c, mask):
    """Q4_K / Q5_K: the 6-bit scale and min of sub-block c (a scalar 0..7) from the 12 bytes at
    s, as float32 [BLOCK_N, 1]."""
    b_c = _byte(s + c, mask)
    b_c4 = _byte(s + c + 4, mask)
    b_cm4 = _byte(s + tl.maximum(c - 4, 0), mask)
    low = c < 4
    sc = tl.where(low, b_c & 63, (b_c4 & 15) | ((b_cm4 >> 6) << 4))
    mn = tl.where(low, b_c4 & 63, (b_c4 >> 4) | ((b_c >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _iq4(kv_ptr, q):
    """IQ4's non-linear levels: the int8 table entry of each 4-bit index q."""
    return tl.load(kv_ptr + q).to(tl.float32)


@triton.jit
def _dequant_tile(w_ptr, kv_ptr, offs_n, n_ok, stride_wn, k0, FMT: tl.constexpr,
                  BLOCK_BYTES: tl.constexpr, BLOCK_ELEMS: tl.constexpr):
    """Weights of rows offs_n at elements [k0, k0 + 32), float32 [BLOCK_N, 32]."""
    i = tl.arange(0, 32)[None, :]
    base = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + (k0 // BLOCK_ELEMS) * BLOCK_BYTES
    mask = n_ok[:, None]
    c = (k0 % BLOCK_ELEMS) // 32                   # the 32-element chunk of a super-block
    if FMT == Q4_0 or FMT == Q4_1 or FMT == IQ4_NL:
        qs = base + 2
        if FMT == Q4_1:
            qs = base + 4
        q = (_byte(qs + i % 16, mask) >> (4 * (i // 16))) & 15
        d = _fp16(base, mask)
        if FMT == Q4_0:
            w = d * (q - 8).to(tl.float32)
        elif FMT == Q4_1:
            w = d * q.to(tl.float32) + _fp16(base + 2, mask)
        else:
            w = d * _iq4(kv_ptr, q)
    elif FMT == Q5_0 or FMT == Q5_1:
        qh = base + 2
        if FMT == Q5_1:
            qh = base + 4
        low = (_byte(qh + 4 + i % 16, mask) >> (4 * (i // 16))) & 15
        high = (_byte(qh + i // 8, mask) >> (i % 8)) & 1
        q = low | (high << 4)
        d = _fp16(base, mask)
        if FMT == Q5_0:
            w = d * (q - 16).to(tl.float32)
        else:
            w = d * q.to(tl.float32) + _fp16(base + 2, mask)
    elif FMT == Q8_0:
        w = _sbyte(base + 2 + i, mask) * _fp16(base, mask)
    elif FMT == Q4_K or FMT == Q5_K:
        sc, mn = _k4_scale_min(base + 4, c, mask)
        if FMT == Q5_K:
            q = (_byte(base + 48 + 32 * (c // 2) + i, mask) >> (4 * (c % 2))) & 15
            q = q | (((_byte(base + 16 + i, mask) >> c) & 1) << 4)
        else:
            q = (_byte(base + 16 + 32 * (c // 2) + i, mask) >> (4 * (c % 2))) & 15
        w = (_fp16(base, mask) * sc) * q.to(tl.float32) - _fp16(base + 2, mask) * mn
    elif FMT == Q6_K:
        h = c // 4
        low = (_byte(base + 64 * h + 32 * (c % 2) + i, mask) >> (4 * ((c % 4) // 2))) & 15
        high = (_byte(base + 128 + 32 * h + i, mask) >> (2 * (c % 4))) & 3
        q = (low | (high << 4)) - 32
        sc = _sbyte(base + 192 + 2 * c + i // 16, mask)
        w = (_fp16(base + 208, mask) * sc) * q.to(tl.float32)
    elif FMT == Q2_K:
        q = (_byte(base + 16 + 32 * (c // 4) + i, mask) >> (2 * (c % 4))) & 3
        s = _byte(base + 2 * c + i // 16, mask)
        w = (_fp16(base + 80, mask) * (s & 15).to(tl.float32)) * q.to(tl.float32) \
            - _fp16(base + 82, mask) * (s >> 4).to(tl.float32)
    elif FMT == Q3_K:
        low = (_byte(base + 32 + 32 * (c // 4) + i, mask) >> (2 * (c % 4))) & 3
        hb = (_byte(base + i, mask) >> c) & 1
        q = low - 4 * (1 - hb)
        sub = 2 * c + i // 16
        s4 = (_byte(base + 96 + sub % 8, mask) >> (4 * (sub // 8))) & 15
        s2 = (_byte(base + 104 + sub % 4, mask) >> (2 * (sub // 4))) & 3
        sc = ((s4 | (s2 << 4)) - 32).to(tl.float32)
        w = (_fp16(base + 108, mask) * sc) * q.to(tl.float32)
    else:   # IQ4_XS
        scales_h = _byte(base + 2, mask) | (_byte(base + 3, mask) << 8)
        ls = ((_byte(base + 4 + c // 2, mask) >> (4 * (c % 2))) & 15) | (((scales_h >> (2 * c)) & 3) << 4)
        q = (_byte(base + 8 + 16 * c + i % 16, mask) >> (4 * (i // 16))) & 15
        w = (_fp16(base, mask) * (ls - 32).to(tl.float32)) * _iq4(kv_ptr, q)
    return w


@triton.jit
def _ggml_kernel(x_ptr, w_ptr, kv_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                 FMT: tl.constexpr, BLOCK_BYTES: tl.constexpr, BLOCK_ELEMS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_DOT: tl.constexpr,
                 DOT_F32: tl.constexpr, PREC: tl.constexpr):
    """Program (m block, n block): the [BLOCK_M, BLOCK_N] tile of y over the whole of K."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < M, offs_n < N
    offs_k = tl.arange(0, 32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, 32):
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :],
                    mask=m_ok[:, None], other=0.0)
        w = _dequant_tile(w_ptr, kv_ptr, offs_n, n_ok, stride_wn, k0, FMT, BLOCK_BYTES,
                          BLOCK_ELEMS)
        if USE_DOT:
            acc += _dot(x, tl.trans(w.to(x.dtype)), DOT_F32, PREC)
        else:
            acc += tl.sum(x.to(tl.float32)[:, None, :] * w[None, :, :], axis=2)
    y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def tile_config(M: int, N: int) -> dict:
    """BLOCK_M / BLOCK_N / warps: GEMV-shaped programs for a few rows, GEMM tiles above."""
    if M <= DOT_MIN_M:
        block_m = next_pow2(M)
        return dict(block_m=block_m, block_n=max(16, 128 // block_m), use_dot=False, num_warps=4)
    big = M >= 256
    return dict(block_m=128 if big else (16 if M <= 16 else 64), block_n=128 if big else 64,
                use_dot=True, num_warps=8 if big else 4)


@functools.lru_cache(maxsize=None)
def _kvalues(device: torch.device) -> torch.Tensor:
    """IQ4's level table on `device`, made once per device (every matmul passes it)."""
    return torch.tensor(IQ4_NL_VALUES, dtype=torch.int8, device=device)


def check_args(x: torch.Tensor, data: torch.Tensor, type_id: int
               ) -> tuple[int, int, int, BlockFormat]:
    """(M, N, K, the format), or ValueError naming what does not fit (type, shapes, dtypes,
    devices)."""
    fmt = format_for_type_id(type_id)
    if fmt.name not in FORMATS:
        raise ValueError(f"ggml_matmul reads block formats {sorted(FORMATS)}, not {fmt.name}")
    if x.dim() != 2 or data.dim() != 2 or data.dtype != torch.uint8:
        raise ValueError(f"ggml_matmul: x [M, K] and uint8 data [N, row_bytes] expected, got "
                         f"x {tuple(x.shape)} and data {data.dtype} {tuple(data.shape)}")
    if x.device != data.device:
        raise ValueError(f"ggml_matmul: x on {x.device}, data on {data.device}")
    M, K = x.shape
    want = row_bytes(fmt.name, K)
    if data.shape[1] != want:
        raise ValueError(f"ggml_matmul: {fmt.name} rows of K={K} hold {want} bytes, "
                         f"data rows hold {data.shape[1]}")
    return M, data.shape[0], K, fmt


def ggml_matmul(x: torch.Tensor, data: torch.Tensor, type_id: int) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequantize(data).T in x's dtype (float32 accumulation).
    CPU tensors without TRITON_INTERPRET fall back to dequantize-then-matmul (one info log)."""
    M, N, K, fmt = check_args(x, data, type_id)
    reason = fallback_reason(_ggml_kernel, x)
    if reason is not None:
        log_fallback("ggml_matmul", reason)
        return x @ dequantize(data, fmt.name).to(x.dtype).T
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    x = x if x.stride(1) == 1 else x.contiguous()
    data = data if data.stride(1) == 1 else data.contiguous()
    cfg = tile_config(M, N)
    dot_f32, prec = dot_options(_ggml_kernel, x.dtype)
    grid = (triton.cdiv(M, cfg["block_m"]), triton.cdiv(N, cfg["block_n"]))
    _ggml_kernel[grid](x, data, _kvalues(x.device), y, M, N, K, x.stride(0), data.stride(0),
                       y.stride(0), FMT=fmt.type_id, BLOCK_BYTES=fmt.block_bytes,
                       BLOCK_ELEMS=fmt.block_elems, BLOCK_M=cfg["block_m"],
                       BLOCK_N=cfg["block_n"], USE_DOT=cfg["use_dot"], DOT_F32=dot_f32,
                       PREC=prec, num_warps=cfg["num_warps"])
    return y
