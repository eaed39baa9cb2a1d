"""KVCache: the preallocated K/V tensors of every layer, and the CPU block pool for swapping.

Layout per layer: k and v of shape [num_blocks_of_its_group, block_size, num_kv_heads, head_dim],
views of one allocation per KV-cache group made at start-up (a sliding-window group has its own,
smaller pool: core.hybrid_kv_cache_manager). Block ids come from `block_pool.BlockPool`; this module only moves
bytes: copy-on-write copies on the device, and swap-out / swap-in between device and CPU, each
batched (many blocks per call), staged through a contiguous buffer when devices differ.

The cache's dtype is EngineConfig.kv_cache_dtype's (kernels/kv_quant.py): for int8 a row is
head_dim + 4 int8 (the values, then their float32 scale), so every move of whole blocks carries
the scales with the values and nothing here depends on the dtype.
"""

from __future__ import annotations

import logging

import torch

from localpaged.core.block_pool import BlockOp, BlockOpKind
from localpaged.kernels.kv_quant import row_bytes, row_width
from localpaged.models.attention import AttentionBackend

logger = logging.getLogger(__name__)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    """Bytes of one block over num_layers layers, K and V, in a cache of this dtype (int8: the
    scales included)."""
    return 2 * num_layers * block_size * num_kv_heads * row_bytes(head_dim, dtype)


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info.get("MemAvailable", 4 << 30)


class KVCache:
    """K/V tensors per KV-cache group: group g's layers share one allocation of
    num_blocks[g] blocks (and num_cpu_blocks[g] for swap), indexed by that group's block ids.

    `layer_group[i]` is layer i's group (models.layer_types.KVGroups); None: one group of every
    layer. `device_blocks` / `cpu_blocks` are group 0's tensors ([layers, 2, blocks, ...])."""

    def __init__(self, num_layers: int, num_blocks: int | list[int], block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 num_cpu_blocks: int | list[int] = 0,
                 layer_group: tuple[int, ...] | None = None) -> None:
        layer_group = tuple(layer_group or (0,) * num_layers)
        num_groups = max(layer_group) + 1
        blocks = num_blocks if isinstance(num_blocks, list) else [num_blocks]
        cpu = num_cpu_blocks if isinstance(num_cpu_blocks, list) else [num_cpu_blocks]
        assert len(blocks) == len(cpu) == num_groups, "one pool size per KV-cache group"
        self.device = device
        pin = device.type == "cuda"
        width = row_width(head_dim, dtype)       # head_dim, or head_dim + 4 for int8
        self.group_blocks: list[torch.Tensor] = []
        self.group_cpu_blocks: list[torch.Tensor | None] = []
        for g in range(num_groups):
            n = layer_group.count(g)
            self.group_blocks.append(torch.zeros((n, 2, blocks[g], block_size, num_kv_heads, width),
                                                 dtype=dtype, device=device))
            self.group_cpu_blocks.append(torch.zeros(
                (n, 2, cpu[g], block_size, num_kv_heads, width), dtype=dtype, pin_memory=pin)
                if cpu[g] else None)
        self.device_blocks, self.cpu_blocks = self.group_blocks[0], self.group_cpu_blocks[0]
        # layer i -> its (k, v) views: its index among its group's layers
        index = [layer_group[:i].count(g) for i, g in enumerate(layer_group)]
        self.layers = [(self.group_blocks[g][j, 0], self.group_blocks[g][j, 1])
                       for g, j in zip(layer_group, index)]

    def apply(self, op: BlockOp, backend: AttentionBackend) -> None:
        """Carry out one block op decided by the KV cache manager, in its group's tensors."""
        device, cpu = self.group_blocks[op.group], self.group_cpu_blocks[op.group]
        if op.kind is BlockOpKind.COPY:
            self._copy(device, op.pairs, backend)
        elif op.kind is BlockOpKind.LOAD:
            self.load(op.group, [dst for _, dst in op.pairs], op.data)
        elif op.kind is BlockOpKind.SWAP_OUT:
            self._move(device, cpu, op.pairs)
        else:
            self._move(cpu, device, op.pairs)

    def block(self, group: int, block_id: int) -> torch.Tensor:
        """One device block of a group, every layer, K and V: [layers, 2, B, Hkv, D] (a view)."""
        return self.group_blocks[group][:, :, block_id]

    def load(self, group: int, block_ids: list[int], data: list[torch.Tensor]) -> None:
        """Blocks read back from the disk tier (runner/kv_disk.py), each shaped as `block`."""
        ids = torch.tensor(block_ids, device=self.device)
        staged = torch.stack(data, dim=2).to(self.device, non_blocking=True)
        self.group_blocks[group].index_copy_(2, ids, staged)

    def copy(self, mapping: list[tuple[int, int]], backend: AttentionBackend) -> None:
        """Copy-on-write in group 0: device block src -> device block dst, every layer, K and V."""
        self._copy(self.device_blocks, mapping, backend)

    def _copy(self, blocks: torch.Tensor, mapping: list[tuple[int, int]],
              backend: AttentionBackend) -> None:
        if not mapping:
            return
        pairs = torch.tensor(mapping, dtype=torch.long, device=self.device)
        flat = blocks.flatten(0, 1)                            # [layers * 2, blocks, ...]
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
