"""KVCache: the preallocated K/V tensors of every layer, and the CPU block pool for swapping.

Layout per layer: k and v of shape [num_blocks, block_size, num_kv_heads, head_dim], views of one
allocation made at start-up. Block ids come from `block_pool.BlockPool`; this module only moves
bytes: copy-on-write copies on the device, and swap-out / swap-in between device and CPU, each
batched (many blocks per call), staged through a contiguous buffer when devices differ.
"""

from __future__ import annotations

import logging

import torch

from localpaged.core.block_pool import BlockOp, BlockOpKind
from localpaged.models.attention import AttentionBackend

logger = logging.getLogger(__name__)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info.get("MemAvailable", 4 << 30)


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device,
                 num_cpu_blocks: int = 0) -> None:
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        self.device = device
        self.device_blocks = torch.zeros(shape, dtype=dtype, device=device)
        pin = device.type == "cuda"
        cpu_shape = (num_layers, 2, num_cpu_blocks, block_size, num_kv_heads, head_dim)
        self.cpu_blocks = torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin) if num_cpu_blocks else None
        self.layers = [(self.device_blocks[i, 0], self.device_blocks[i, 1]) for i in range(num_layers)]

    def apply(self, op: BlockOp, backend: AttentionBackend) -> None:
        """Carry out one block op decided by the KV cache manager."""
        if op.kind is BlockOpKind.COPY:
            self.copy(op.pairs, backend)
        elif op.kind is BlockOpKind.SWAP_OUT:
            self.swap_out(op.pairs)
        else:
            self.swap_in(op.pairs)

    def copy(self, mapping: list[tuple[int, int]], backend: AttentionBackend) -> None:
        """Copy-on-write: device block src -> device block dst, for every layer, K and V."""
        if not mapping:
            return
        pairs = torch.tensor(mapping, dtype=torch.long, device=self.device)
        flat = self.device_blocks.flatten(0, 1)                # [layers * 2, blocks, ...]
        for cache in flat:
            backend.copy_blocks(cache, cache, pairs)

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        self._move(self.device_blocks, self.cpu_blocks, mapping)

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        self._move(self.cpu_blocks, self.device_blocks, mapping)

    @staticmethod
    def _move(src: torch.Tensor, dst: torch.Tensor, mapping: list[tuple[int, int]]) -> None:
        """Gather src blocks into one contiguous buffer, transfer once, scatter into dst."""
        if not mapping:
            return
        src_ids = torch.tensor([m[0] for m in mapping], device=src.device)
        dst_ids = torch.tensor([m[1] for m in mapping], device=dst.device)
        staged = src.index_select(2, src_ids).to(dst.device, non_blocking=True)
        dst.index_copy_(2, dst_ids, staged)
