"""The attention-backend seam: flat-batch metadata and the kernels that read the paged cache.

The model runner builds one AttentionMetadata per step and passes it down explicitly (no global
context). Tokens are laid out decodes first (one token per decoding sequence), then the prefill
chunks. `AttentionBackend` is the contract a backend meets: four kernels over the paged cache
(write_kv, paged_decode_attention, paged_prefill_attention, copy_blocks). "torch" uses the
references in `localpaged.kernels.reference`, "cpu" those with decode attention in C++
(`localpaged.kernels.cpu_ops`, the default on CPU), "triton" the Triton kernels (GPU, or CPU
under TRITON_INTERPRET=1, the default on CUDA); each module exports the four functions with the
same signatures.
`PagedAttention.forward` splits a flat batch between the decode and prefill kernels (a prefill
with runs of two-way attention, `AttentionMetadata.open_runs`, passes them to the backend's
prefill: the reference's, which the "cpu" backend uses too, and the Triton kernel's); a kernel
module may also export `decode_one` (write + attend for a batch of one decoding sequence,
given AttentionMetadata.decode_runs), which forward then uses for that batch.
See docs/architecture.md §5 step 4 (forward) and §8 (kernel tests).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import torch

from localpaged.core.config import ATTENTION_BACKENDS, check_choice

logger = logging.getLogger(__name__)



@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor            # [T] int64, cache slot of each new token
    num_decode_tokens: int                # tokens [0, D) are decodes, one per sequence
    decode_block_tables: torch.Tensor     # [D, max_blocks] int32
    decode_seq_lens: torch.Tensor         # [D] int32, context length including the new token
    prefill_block_tables: torch.Tensor    # [P, max_blocks] int32
    prefill_query_start_loc: torch.Tensor  # [P + 1] int32, offsets into tokens [D, T)
    prefill_seq_lens: torch.Tensor        # [P] int32
    # Set only when the whole batch is one decoding sequence: (first slot, length) runs of its
    # context (kernels.reference.decode_runs; with a window, of the window only), so a backend
    # with `decode_one` reads its K/V in place without reading the block table back each layer.
    # None otherwise.
    decode_runs: list[tuple[int, int]] | None = None
    # The layers this metadata serves attend to the last `window` positions (0: all). One
    # AttentionMetadata per KV-cache group (models.layer_types.KVGroups): a group's block tables
    # and slots index its own cache tensors.
    window: int = 0
    # Per prefill sequence, the runs of positions [lo, hi) whose tokens attend to each other
    # both ways (a Gemma 3 image's tokens, runner/image_batch.py: open_runs); every run lies in
    # its sequence's chunk of this step. None: every prefill is causal.
    open_runs: list[list[tuple[int, int]]] | None = None


def layer_metadata(meta: AttentionMetadata | list[AttentionMetadata], windows: tuple[int, ...],
                   layer_group: tuple[int, ...]) -> list[AttentionMetadata]:
    """Per layer, the metadata of its KV-cache group (models.layer_types.KVGroups).

    `meta` is one AttentionMetadata per group (each group's own block tables), or a single one
    that every group shares: then each group still attends over its own window, through the
    shared tables (the blocks before a window are kept, only not read).
    """
    if isinstance(meta, AttentionMetadata):
        shared = [meta if meta.window == w else replace(meta, window=w) for w in windows]
        return [shared[g] for g in layer_group]
    if len(meta) != len(windows):
        raise ValueError(f"{len(meta)} attention metadata for {len(windows)} KV-cache groups")
    return [meta[g] for g in layer_group]


@runtime_checkable
class AttentionBackend(Protocol):
    """What every backend provides. Caches are [num_blocks, block_size, num_kv_heads, head_dim]."""

    name: str

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store key/value [T, Hkv, D] into their slots; a negative slot skips the token."""
        ...

    def paged_decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens: torch.Tensor,
                               scale: float, window: int = 0) -> torch.Tensor:
        """One query token per sequence, q [S, H, D], over its seq_lens[s] cached tokens (the
        last `window` of them; 0: all). Table entries before the window are never read."""
        ...

    def paged_prefill_attention(self, q: torch.Tensor, k_cache: torch.Tensor,
                                v_cache: torch.Tensor, block_tables: torch.Tensor,
                                query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                                scale: float, window: int = 0,
                                open_runs: list[list[tuple[int, int]]] | None = None) -> torch.Tensor:
        """New tokens of each sequence (causal) over its cached prefix and themselves (each over
        the last `window` positions up to its own; 0: all); the tokens of a run [lo, hi) in
        `open_runs[i]` also see the run's later keys (core.multimodal: Gemma 3's images)."""
        ...

    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor,
                    block_mapping: torch.Tensor) -> None:
        """dst[block_mapping[p, 1]] = src[block_mapping[p, 0]] for every pair p."""
        ...


class PagedAttention:
    """A backend built from a kernel module that exports the four functions of the contract."""

    def __init__(self, name: str, kernels) -> None:
        self.name = name
        self.write_kv = kernels.write_kv
        self.paged_decode_attention = kernels.paged_decode_attention
        self.paged_prefill_attention = kernels.paged_prefill_attention
        self.copy_blocks = kernels.copy_blocks
        self.decode_one = getattr(kernels, "decode_one", None)   # optional batch-1 fast path

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Write new K/V into the cache, then attend through the block tables.

        q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]."""
        if meta.decode_runs is not None and self.decode_one is not None:
            return self.decode_one(q, k, v, k_cache, v_cache, meta.slot_mapping, meta.decode_runs, scale)
        self.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        d, w = meta.num_decode_tokens, meta.window
        if d == q.shape[0]:
            return self.paged_decode_attention(q, k_cache, v_cache, meta.decode_block_tables,
                                               meta.decode_seq_lens, scale, w)
        out = torch.empty_like(q)
        if d:
            out[:d] = self.paged_decode_attention(q[:d], k_cache, v_cache,
                                                  meta.decode_block_tables,
                                                  meta.decode_seq_lens, scale, w)
        out[d:] = self.paged_prefill_attention(q[d:], k_cache, v_cache, meta.prefill_block_tables,
                                               meta.prefill_query_start_loc,
                                               meta.prefill_seq_lens, scale, w,
                                               open_runs=meta.open_runs)
        return out


def get_backend(name: str, device: torch.device) -> PagedAttention:
    check_choice("attention_backend", name, ATTENTION_BACKENDS)
    if name == "auto":
        name = "triton" if device.type == "cuda" else "cpu"
    if name == "cpu" and device.type != "cpu":
        raise ValueError(f"the cpu attention backend runs on CPU, not {device.type}")
    if name == "triton":
        from localpaged.kernels import triton_ops as kernels
    elif name == "cpu":
        from localpaged.kernels import cpu_ops as kernels
        kernels.start()               # builds the C++ kernel in the background (cpu_extension)
    else:
        from localpaged.kernels import reference as kernels
    backend = PagedAttention(name, kernels)
    assert isinstance(backend, AttentionBackend), f"{name} kernels miss part of the contract"
    return backend
