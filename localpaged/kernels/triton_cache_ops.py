"""Triton cache maintenance: ``write_kv`` (new K/V into their slots through the slot mapping) and
``copy_blocks`` (many whole-block copies in one launch, for copy-on-write).

Same signatures as in ``reference``. Both work for any head dim (it is padded and masked).
An int8 cache (kernels/kv_quant.py) is quantized by write_kv as kv_quant.quantize does: scale
max|x| / 127 (at least SCALE_FLOOR, IEEE division), q = x / scale rounded half to even, so the
bytes equal the reference's; copy_blocks moves rows, scales included, whatever the dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference
from .kv_quant import SCALE_FLOOR
from .triton_common import fallback_reason, log_fallback, next_pow2, scale_view

COPY_CHUNK = 1024   # elements of a block copied per program
_SCALE_FLOOR = tl.constexpr(SCALE_FLOOR)


@triton.jit
def _round_half_even(y):
    """torch.round for |y| <= 127 (exact: y + 0.5 needs no rounding there)."""
    r = tl.floor(y + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(((r - y) == 0.5) & odd, r - 1.0, r)


@triton.jit
def _store_row(x, cache, words, offset, offs_d, mask, row_ok, HEAD_DIM: tl.constexpr,
               INT8: tl.constexpr):
    """One (token, head) row x [D_PAD] at element `offset` of a cache (INT8: quantized, its
    scale in word (offset + D) / 4 of `words`, the cache as float32)."""
    if INT8:
        x = x.to(tl.float32)
        amax = tl.max(tl.where(mask, tl.abs(x), 0.0), 0)
        scale = tl.maximum(tl.math.div_rn(amax, 127.0), _SCALE_FLOOR)
        q = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(x, scale)), -127.0), 127.0)
        tl.store(cache + offset + offs_d, q.to(tl.int8), mask=mask)
        tl.store(words + (offset + HEAD_DIM) // 4, scale, mask=row_ok)
    else:
        tl.store(cache + offset + offs_d, x.to(cache.dtype.element_ty), mask=mask)


@triton.jit
def _write_kv_kernel(key, value, k_cache, v_cache, k_words, v_words, slot_mapping,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                     INT8: tl.constexpr):
    """Program (token, kv_head): one head vector of K and of V. slot < 0: nothing is stored."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_mapping + t).to(tl.int64)
    offs_d = tl.arange(0, D_PAD)
    mask = (offs_d < HEAD_DIM) & ((slot + tl.zeros([D_PAD], tl.int64)) >= 0)   # a vector mask
    slot = tl.maximum(slot, 0)          # keeps the (masked) address in range
    block = slot // BLOCK_SIZE
    in_block = slot % BLOCK_SIZE
    t64 = t.to(tl.int64)
    k = tl.load(key + t64 * stride_kt + h * stride_kh + offs_d, mask=mask)
    v = tl.load(value + t64 * stride_vt + h * stride_vh + offs_d, mask=mask)
    slot_ok = tl.load(slot_mapping + t) >= 0
    _store_row(k, k_cache, k_words, block * stride_kcb + in_block * stride_kcs + h * stride_kch,
               offs_d, mask, slot_ok, HEAD_DIM, INT8)
    _store_row(v, v_cache, v_words, block * stride_vcb + in_block * stride_vcs + h * stride_vch,
               offs_d, mask, slot_ok, HEAD_DIM, INT8)


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store key/value [T, Hkv, D] into their slots; a negative slot means "skip this token"."""
    reason = fallback_reason(_write_kv_kernel, k_cache, caches=(k_cache, v_cache))
    if reason is not None:
        log_fallback("write_kv", reason)
        return reference.write_kv(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    slots = slot_mapping.to(device=k_cache.device).contiguous()
    _write_kv_kernel[(num_tokens, num_kv_heads)](
        key, value, k_cache, v_cache, scale_view(k_cache), scale_view(v_cache), slots,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim, D_PAD=next_pow2(head_dim),
        INT8=k_cache.dtype == torch.int8)


@triton.jit
def _copy_blocks_kernel(src, dst, block_mapping, block_numel, CHUNK: tl.constexpr):
    """Program (pair, chunk): elements [chunk * CHUNK, +CHUNK) of one block, src -> dst.

    Invariant (caller's): when src is dst, no block is both a source and a destination in one
    call; programs run in any order, so a chain a->b, b->c would race.
    """
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src_block = tl.load(block_mapping + 2 * pair).to(tl.int64)
    dst_block = tl.load(block_mapping + 2 * pair + 1).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    x = tl.load(src + src_block * block_numel + offs, mask=mask)
    tl.store(dst + dst_block * block_numel + offs, x.to(dst.dtype.element_ty), mask=mask)


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """dst[block_mapping[p, 1]] = src[block_mapping[p, 0]] for every pair p.

    src and dst share a device and a block shape; they may be the same tensor (copy-on-write).
    Swapping between devices stages through a contiguous buffer (see localpaged.runner.kv_cache).
    """
    if block_mapping.numel() == 0:
        return
    reason = fallback_reason(_copy_blocks_kernel, src)
    if reason is None and not (src.is_contiguous() and dst.is_contiguous()):
        reason = "src or dst is not contiguous"
    if reason is None and src.device != dst.device:
        reason = "src and dst are on different devices"
    if reason is not None:
        log_fallback("copy_blocks", reason)
        return reference.copy_blocks(src, dst, block_mapping)
    mapping = block_mapping.to(device=src.device, dtype=torch.int64).contiguous()
    block_numel = src[0].numel()
    grid = (mapping.shape[0], triton.cdiv(block_numel, COPY_CHUNK))
    _copy_blocks_kernel[grid](src, dst, mapping, block_numel, CHUNK=COPY_CHUNK)
