"""CUDA graphs for decode steps: capture sizes, padding, static buffers and replay.

A decode step of a small model on a GPU is bound by kernel launches (hundreds per step); a
captured graph replays them all with one launch. Graphs are captured at start-up for a set of
batch sizes (`capture_sizes`); a decode-only batch is padded to the next captured size
(`padded_size`) and replayed; prefill, mixed batches and batches larger than the largest size
run eagerly. Padding rows write nowhere (slot -1) and attend to one token of block 0; their
outputs are dropped.

Invariants:
- Every tensor a graph reads or writes lives in `StaticDecodeBuffers`, allocated once; a step only
  copies into them (replay reads fixed addresses).
- The rotary table is built up to max_model_len before capture and the model gets that bound, so
  no step reads a position back from the device or grows the table during replay.
- A graph's output [size, hidden] is overwritten by the next replay: the caller consumes it first.

On CPU (tests) the same runner works with `capture=False`: the model runs eagerly on the static
buffers, which exercises filling, padding and slicing at every captured size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from localpaged.models.attention import AttentionMetadata, PagedAttention

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture, ascending: 1, 2, 4, 8, then every 8 up to max_num_seqs (vLLM's
    scheme), always including max_num_seqs itself (capped at 256)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    limit = min(max_num_seqs, 256)
    sizes = [s for s in (1, 2, 4) if s <= limit] + list(range(8, limit + 1, 8))
    if sizes[-1] != limit:
        sizes.append(limit)
    return sizes


def padded_size(batch: int, sizes: list[int]) -> int | None:
    """The smallest captured size >= batch, or None when the batch is larger than all of them."""
    for size in sizes:
        if size >= batch:
            return size
    return None


@dataclass
class StaticDecodeBuffers:
    """The fixed-address inputs and output of the captured graphs (rows [0, max_batch))."""
    input_ids: torch.Tensor      # [N] int64
    positions: torch.Tensor      # [N] int64
    slot_mapping: torch.Tensor   # [N] int64, -1 on padding rows
    block_tables: torch.Tensor   # [N, W] int32, W = blocks of max_model_len
    seq_lens: torch.Tensor       # [N] int32, 1 on padding rows
    empty_tables: torch.Tensor   # [0, W] int32 (no prefill)
    empty_lens: torch.Tensor     # [0] int32
    zero_loc: torch.Tensor       # [1] int32

    @classmethod
    def allocate(cls, max_batch: int, max_blocks: int, device: torch.device) -> StaticDecodeBuffers:
        def ints(*shape, dtype=torch.int32):
            return torch.zeros(shape, dtype=dtype, device=device)
        return cls(ints(max_batch, dtype=torch.long), ints(max_batch, dtype=torch.long),
                   ints(max_batch, dtype=torch.long), ints(max_batch, max_blocks), ints(max_batch),
                   ints(0, max_blocks), ints(0), ints(1))

    def fill(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
             size: int) -> None:
        """Copy a decode batch of B <= size rows in; rows [B, size) become padding."""
        batch, width = input_ids.shape[0], meta.decode_block_tables.shape[1]
        self.input_ids[:batch].copy_(input_ids)
        self.positions[:batch].copy_(positions)
        self.slot_mapping[:batch].copy_(meta.slot_mapping)
        self.seq_lens[:batch].copy_(meta.decode_seq_lens)
        self.block_tables[:batch, :width].copy_(meta.decode_block_tables)
        self.block_tables[:batch, width:].zero_()
        if size > batch:
            self.input_ids[batch:size].zero_()
            self.positions[batch:size].zero_()
            self.slot_mapping[batch:size].fill_(-1)
            self.seq_lens[batch:size].fill_(1)
            self.block_tables[batch:size].zero_()

    def meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], num_decode_tokens=size,
            decode_block_tables=self.block_tables[:size], decode_seq_lens=self.seq_lens[:size],
            prefill_block_tables=self.empty_tables, prefill_query_start_loc=self.zero_loc,
            prefill_seq_lens=self.empty_lens)


class DecodeGraphRunner:
    """Replays a captured decode graph per padded batch size; `capture=False` runs the same
    static-buffer path eagerly (CPU tests)."""

    def __init__(self, model, kv_layers: list, backend: PagedAttention, sizes: list[int],
                 max_model_len: int, block_size: int, device: torch.device, dtype: torch.dtype,
                 capture: bool = True) -> None:
        self.model, self.kv_layers, self.backend = model, kv_layers, backend
        self.sizes = sizes
        self.max_blocks = -(-max_model_len // block_size)
        self.max_position = max_model_len - 1
        self.buffers = StaticDecodeBuffers.allocate(sizes[-1], self.max_blocks, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        model.rotary.table(self.max_position, dtype)       # built before any capture
        if capture:
            self._capture_all()

    def can_run(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        """A decode-only batch that fits a captured size and the static block-table width, of a
        model whose layers all attend fully (the captured buffers hold one group's tables)."""
        return (isinstance(meta, AttentionMetadata) and not self.model.kv_groups.has_window
                and meta.num_decode_tokens == num_tokens and num_tokens > 0
                and num_tokens <= self.sizes[-1]
                and meta.decode_block_tables.shape[1] <= self.max_blocks)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [B, hidden] of a decode batch (a view valid until the next run)."""
        batch = input_ids.shape[0]
        size = padded_size(batch, self.sizes)
        self.buffers.fill(input_ids, positions, meta, size)
        graph = self.graphs.get(size)
        if graph is not None:
            graph.replay()
            return self.outputs[size][:batch]
        return self._forward(size)[:batch]

    def _forward(self, size: int) -> torch.Tensor:
        b = self.buffers
        return self.model(b.input_ids[:size], b.positions[:size], self.kv_layers, b.meta(size),
                          self.backend, self.max_position)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        self.buffers.slot_mapping.fill_(-1)          # capture runs write no KV
        self.buffers.seq_lens.fill_(1)
        for size in reversed(self.sizes):            # largest first: smaller ones reuse its pool
            self._forward(size)                      # warm-up: autotune/compile outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)
