"""The KV cache's storage dtypes: how a (token, KV head) row of K or V is stored and read back.

EngineConfig.kv_cache_dtype picks one (core/config.py KV_CACHE_DTYPES):
- float32 / bfloat16 / float16: the cache in that dtype, [num_blocks, block_size, Hkv, D];
  a kernel converts a row on load (bfloat16/float16 round on write, as `.to(dtype)`).
- int8: the cache is torch.int8, [num_blocks, block_size, Hkv, D + 4]: each (token, head) row
  is D int8 values q then the 4 bytes of its float32 scale s (native byte order), and the row
  stands for q * s. On write s = max|x| / 127 (at least SCALE_FLOOR, so an all-zero row stores
  q = 0 and s = SCALE_FLOOR: exactly 0 back) and q = round(x / s) (half to even), so
  |x - q * s| <= s / 2 per element. One scale per token and head: a large value in one row
  coarsens only that row.
One tensor per layer for K and one for V either way, so block ops (copy-on-write, swap, the disk
tier) move whole rows, scales included, without knowing the dtype.

`quantize` / `dequantize` are the definition: the C++ write (kernels/batch1_cpu.cpp) makes the
same ATen calls, and the C++ / Triton kernels read the same bytes (q as int8, then * s).
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4                                   # one float32 after the D values of a row
SCALE_FLOOR = torch.finfo(torch.float32).tiny     # the scale of an all-zero row
NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
         "int8": torch.int8}


def resolve(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache dtype for EngineConfig.kv_cache_dtype ("auto": the model's dtype)."""
    return model_dtype if name == "auto" else NAMES[name]


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one (token, head) row of a cache of this dtype: D, or D + 4 for int8."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def row_bytes(head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one (token, head) row: what a token costs per layer, KV head, K or V."""
    return row_width(head_dim, dtype) * torch.empty(0, dtype=dtype).element_size()


def is_int8(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.int8


def head_dim(cache: torch.Tensor) -> int:
    """The head size of a cache's rows (its last dimension, less the scale for int8)."""
    return cache.shape[-1] - SCALE_BYTES if is_int8(cache) else cache.shape[-1]


def quantize(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (any float dtype) as int8 rows [..., D + 4]: q then the float32 scale's bytes."""
    x = x.float()
    scale = (x.abs().amax(-1, keepdim=True) / 127).clamp_min(SCALE_FLOOR)
    # |x / scale| <= 127 (1 + float32 rounding) since scale >= max|x| / 127: round() stays in
    # [-127, 127] with no clamp (one op fewer on the per-layer decode write)
    q = (x / scale).round().to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], -1)


def dequantize(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 rows [..., D + 4] as values [..., D] of dtype (q * s computed in float32)."""
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    return (rows[..., :-SCALE_BYTES].float() * scale).to(dtype)


def store(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """Rows of x [..., D] as the cache holds them."""
    if cache_dtype == torch.int8:
        return quantize(x)
    return x if x.dtype == cache_dtype else x.to(cache_dtype)


def store_pair(key: torch.Tensor, value: torch.Tensor,
               cache_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """store() of a step's keys and values [T, Hkv, D] at once: int8 quantizes both in one pass
    over the stacked rows (the same rows as two calls; half the small ops per layer)."""
    if cache_dtype != torch.int8 or key.shape != value.shape:
        return store(key, cache_dtype), store(value, cache_dtype)
    rows = quantize(torch.stack([key, value]))
    return rows[0], rows[1]


def load(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cached rows [..., row_width] as values [..., D] of dtype (a view where no conversion)."""
    if rows.dtype == torch.int8:
        return dequantize(rows, dtype)
    return rows if rows.dtype == dtype else rows.to(dtype)
