"""Packed weights in the form torch's CPU weight-only kernels read, and the choice of that form
(made by PackedWeight.cpu_form, quant/layout.py).

torch's `aten._weight_int4pack_mm_for_cpu` and `aten._weight_int8pack_mm` take bf16
activations (with float32 ones they are many times slower): activations are cast to bf16 first.
One kernel serves every batch size, decode and prefill chunks alike, so a row's value does not
depend on what else is in the batch (docs/benchmarks.md, 'Quantized weights', has the
measured speeds).

The forms:
- int4 where the CPU extension is built with AVX-512 BF16 (N divisible by 32, group a multiple
  of 8): `CpuInt4Tiles` (quant/cpu_tiles.py), the extension's own kernel, faster again.
- int4 otherwise (N divisible by 16): `CpuInt4Weight`, torch's own tiled nibble layout plus bf16
  (scale, zero) pairs with w = (q - 8) * scale + zero, i.e. zero = min + 8 * scale for our
  w = q * scale + min. The canonical PackedWeight is dropped: one copy in memory.
- int8 grouped (GGUF Q8_0, group 32): requantized per output channel (the packed int8 op takes
  one scale per row; docs/benchmarks.md, 'Quantized weights', has what it costs SmolLM2's Q8_0
  embedding/lm_head in perplexity).
- int8 per channel: as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from localpaged.quant.weight import Batch1Code, Batch1Layout, WeightDefaults

INT4_N_MULTIPLE = 16          # _convert_weight_to_int4pack_for_cpu needs N % 16 == 0


@dataclass
class CpuInt4Weight(WeightDefaults):
    group_size: int
    packed: torch.Tensor          # uint8 [N, K // 2] in torch's CPU layout (opaque)
    scales_zeros: torch.Tensor    # bf16 [K // G, N, 2]: w = (q - 8) * scale + zero
    shape: tuple[int, int]        # logical (N, K)
    bits: ClassVar[int] = 4
    per_channel: ClassVar[bool] = False

    @classmethod
    def from_packed(cls, pw) -> CpuInt4Weight:
        """From a canonical int4 PackedWeight (quant/layout.py, which builds on this module)."""
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(pw.int_values().to(torch.int32), 1)
        scales = pw.scales.float()
        zeros = pw.mins.float() + 8 * scales
        pairs = torch.stack((scales, zeros), dim=-1).transpose(0, 1).contiguous()
        return cls(pw.group_size, packed, pairs.to(torch.bfloat16), pw.shape)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_zeros))

    @property
    def format(self) -> str:
        return f"int4 g{self.group_size}"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x.dtype (bf16 activations and result inside)."""
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16).contiguous(), self.packed, self.group_size, self.scales_zeros)
        return y.to(x.dtype)

    def kernels(self) -> set[str]:
        return {"torch"}

    def batch1_layout(self) -> Batch1Layout:
        return [Batch1Code.INT4_TORCH, self.group_size], [self.packed, self.scales_zeros]

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
        """w [N, K] as the kernel sees it (bf16 values), read back through the kernel itself."""
        w = self.matmul(torch.eye(self.shape[1], dtype=torch.bfloat16)).t()
        return (w if rows is None else w.index_select(0, rows)).to(dtype)
