"""Triton paged-attention kernels: the GPU path of the engine.

Exports the same four functions, with the same signatures, as ``reference`` (the plain-torch
ground truth), so a caller switches backends by switching modules:
- ``write_kv``: new K/V into their cache slots through the slot mapping (triton_cache_ops);
- ``paged_decode_attention``: one query token per sequence, plain or split-K (triton_decode);
- ``paged_prefill_attention``: new tokens over their cached prefix, causal, runs of two-way
  attention opened (triton_prefill);
- ``copy_blocks``: batched whole-block copies for copy-on-write (triton_cache_ops).

The kernels run on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before this
module was imported (slow; for tests). Anything else (CPU tensors without the interpreter, a head
dim outside [16, 256]) falls back to the reference with one info log line.
"""

from .triton_cache_ops import copy_blocks, write_kv
from .triton_decode import paged_decode_attention
from .triton_prefill import paged_prefill_attention

__all__ = ["write_kv", "paged_decode_attention", "paged_prefill_attention", "copy_blocks"]
