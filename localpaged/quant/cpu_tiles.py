"""CpuInt4Tiles: int4 weights in the layout of the CPU extension's own kernel (kernels/cpu_int4.cpp).

Used instead of CpuInt4Weight (torch's int4 layout and kernel) where the extension is built with
AVX-512 BF16 when the model loads: half the instructions per weight, one sequential stream per
block of 32 output rows, float16 scales and mins as the GGUF stores them and a float32 result
(see the .cpp). The layout is chosen once per model load, never switched while a model serves:
a row's value then never depends on when it was computed.

The layout and its packing: kernels/cpu_int4_layout.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from localpaged.kernels import cpu_extension, cpu_int4_layout
from localpaged.quant.weight import Batch1Code, Batch1Layout, WeightDefaults

_ROWS_PER_PACK = 4096                # rows packed at a time: bounded temporaries at load


def fits(pw) -> bool:
    """Whether the kernel takes this int4 PackedWeight's shape and group size."""
    return pw.bits == 4 and cpu_int4_layout.fits(*pw.shape, pw.group_size)


def available() -> bool:
    """The extension is loaded and multiplies with AVX-512 BF16 (waits for a build that is only
    being loaded from its cache; a first build on this machine is not waited for)."""
    module = cpu_extension.BUILD.module_if_cached()
    return module is not None and module.int4_vectorized()


@dataclass
class CpuInt4Tiles(WeightDefaults):
    group_size: int
    packed: torch.Tensor          # int32 [N / 32, K / 8, 2, 16]
    scales: torch.Tensor          # float16 [K / G, N]
    mins: torch.Tensor            # float16 [K / G, N]
    shape: tuple[int, int]        # logical (N, K)
    bits: ClassVar[int] = 4
    per_channel: ClassVar[bool] = False

    @classmethod
    def from_packed(cls, pw) -> CpuInt4Tiles:
        """From a canonical int4 PackedWeight (quant/layout.py, which builds on this module)."""
        N = pw.shape[0]
        parts = [cpu_int4_layout.pack(pw.int_values(torch.arange(i, min(i + _ROWS_PER_PACK, N))))
                 for i in range(0, N, _ROWS_PER_PACK)]
        return cls(pw.group_size, torch.cat(parts), pw.scales.t().to(torch.float16).contiguous(),
                   pw.mins.t().to(torch.float16).contiguous(), pw.shape)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales, self.mins))

    @property
    def format(self) -> str:
        return f"int4 g{self.group_size}"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x.dtype (bf16 activations, float32 sums inside)."""
        y = cpu_extension.BUILD.module.int4_matmul(x.float(), self.packed, self.scales, self.mins,
                                                   self.group_size)
        return y.to(x.dtype)

    def kernels(self) -> set[str]:
        return {cpu_extension.describe(cpu_extension.BUILD.module)}

    def batch1_layout(self) -> Batch1Layout:
        return [Batch1Code.INT4_TILES, self.group_size], [self.packed, self.scales, self.mins]

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
        """w [N, K] as the kernel sees it, read back through the kernel itself."""
        w = self.matmul(torch.eye(self.shape[1])).t()
        return (w if rows is None else w.index_select(0, rows)).to(dtype)
