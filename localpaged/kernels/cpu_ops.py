"""The `cpu` attention backend: the torch reference, with decode attention in C++.

`paged_decode_attention` runs kernels/cpu_decode.cpp (flash-decoding over the block tables,
vectorized, on torch's threads) once the CPU extension is built (kernels/cpu_extension.py),
for float32 queries over float32, bfloat16, float16 or int8 caches (kernels/kv_quant.py) with a
head size that is a multiple of 16 (at most 256); otherwise, and until then, the reference. A sliding window (`window` > 0) is the kernel's too: it reads only the
blocks inside each sequence's window. Writing K/V, prefill attention and block copies are the
reference's. The kernel's result for a sequence does not depend on the batch around it or the
thread count.
"""

from __future__ import annotations

import torch

from localpaged.kernels import cpu_extension, reference
from localpaged.kernels.reference import copy_blocks, paged_prefill_attention, write_kv

__all__ = ["write_kv", "paged_decode_attention", "paged_prefill_attention", "copy_blocks",
           "supports", "start"]


CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int8)


def start() -> None:
    """Start building the extension in the background (once per process)."""
    cpu_extension.BUILD.start()


def supports(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether the C++ decode kernel serves a cache of this head size and dtype."""
    return dtype in CACHE_DTYPES and head_dim % 16 == 0 and head_dim <= 256


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float, window: int = 0) -> torch.Tensor:
    """One query token per sequence, q [S, H, D], over its seq_lens[s] cached tokens (the last
    `window` of them with a window)."""
    module = cpu_extension.BUILD.module
    if module is None or q.dtype != torch.float32 or not supports(q.shape[2], k_cache.dtype):
        return reference.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens,
                                                scale, window)
    return module.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                         window)
