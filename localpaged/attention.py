"""The attention-backend seam: flat-batch metadata and the kernels that read the paged cache.

The model runner builds one AttentionMetadata per step and passes it down explicitly (no global
context). Tokens are laid out decodes first (one token per decoding sequence), then the prefill
chunks. `AttentionBackend` bundles the four kernels; "torch" uses the references in
`localpaged.kernels.reference`, "triton" the Triton kernels (GPU, or CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "triton")


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor            # [T] int64, cache slot of each new token
    num_decode_tokens: int                # tokens [0, D) are decodes, one per sequence
    decode_block_tables: torch.Tensor     # [D, max_blocks] int32
    decode_seq_lens: torch.Tensor         # [D] int32, context length including the new token
    prefill_block_tables: torch.Tensor    # [P, max_blocks] int32
    prefill_query_start_loc: torch.Tensor  # [P + 1] int32, offsets into tokens [D, T)
    prefill_seq_lens: torch.Tensor        # [P] int32


class AttentionBackend:
    """Write new K/V into the cache, then attend through the block tables."""

    def __init__(self, ops: ModuleType, name: str) -> None:
        self.ops = ops
        self.name = name

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]."""
        self.ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        d = meta.num_decode_tokens
        if d == q.shape[0]:
            return self.ops.paged_decode_attention(q, k_cache, v_cache, meta.decode_block_tables,
                                                   meta.decode_seq_lens, scale)
        out = torch.empty_like(q)
        if d:
            out[:d] = self.ops.paged_decode_attention(q[:d], k_cache, v_cache,
                                                      meta.decode_block_tables,
                                                      meta.decode_seq_lens, scale)
        out[d:] = self.ops.paged_prefill_attention(q[d:], k_cache, v_cache,
                                                   meta.prefill_block_tables,
                                                   meta.prefill_query_start_loc,
                                                   meta.prefill_seq_lens, scale)
        return out

    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor, mapping: torch.Tensor) -> None:
        self.ops.copy_blocks(src, dst, mapping)


def get_backend(name: str, device: torch.device) -> AttentionBackend:
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "triton":
        from localpaged.kernels import triton_ops
        return AttentionBackend(triton_ops, "triton")
    from localpaged.kernels import reference
    return AttentionBackend(reference, "torch")
