"""The weight-type contract: what every form of a quantized weight offers the layers above it.

The forms: `PackedWeight` (quant/layout.py: the canonical int8 / int4 layout), `CpuInt4Weight`
and `CpuInt4Tiles` (quant/cpu.py, quant/cpu_tiles.py: the CPU int4 kernels' layouts),
`GgmlWeight` (quant/ggml.py: GGUF blocks as the file stores them) and `PartsWeight` (a fused
matrix whose parts keep forms of their own). The model's modules (quant/linear.py), the loader's
install and summary, and the CPU batch-1 loop (runner/batch1_cpu.py) call these members and
never ask which form they hold: a new form implements `QuantWeight` and nothing else changes.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Protocol, runtime_checkable

import torch


class Batch1Code(IntEnum):
    """How kernels/batch1_cpu.cpp computes one linear (its enum Code, the same numbers)."""
    LINEAR = 0          # float32 F.linear
    SPLIT = 1           # float32, the rows split over threads (models/linear.py)
    INT4_TORCH = 2      # CpuInt4Weight: aten._weight_int4pack_mm_for_cpu
    INT4_TILES = 3      # CpuInt4Tiles: the extension's int4 kernel
    GGML = 4            # GgmlWeight on the extension's kernel
    GGML_PARTS = 5      # PartsWeight of GgmlWeights on the extension's kernel


BIAS = 16               # added to a code: the linear adds a float32 bias (batch1_cpu.cpp)

# (code, parameter) and the tensors that code reads, in batch1_cpu.cpp's order
Batch1Layout = tuple[list[int], list[torch.Tensor]]


@runtime_checkable
class QuantWeight(Protocol):
    shape: tuple[int, int]                  # logical (N, K): y = x @ w.T

    @property
    def nbytes(self) -> int:
        """Bytes this form holds (its tensors)."""

    @property
    def format(self) -> str:
        """What it is, for people: "int4 g32", "Q4_K", "Q4_K+Q6_K"."""

    def formats(self) -> dict[str, int]:
        """Weights per format (for the engine's summary)."""

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x.dtype, by the kernel of this form and x's device."""

    def dequantize(self, dtype: torch.dtype = torch.float32,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
        """w [N, K] (or the selected rows) in dtype: the reference the kernels are tested
        against, and an embedding's row gather."""

    def linear_form(self) -> QuantWeight:
        """The form a Linear of this weight multiplies fastest on its device."""

    def embedding_form(self) -> QuantWeight:
        """The form an Embedding of this weight gathers rows from."""

    def batch1_layout(self) -> Batch1Layout | None:
        """How the C++ batch-1 loop computes this weight's linear; None: it cannot."""

    def kernels(self) -> set[str]:
        """What multiplies it, as the engine's stats name it: "cpu extension (<its path>)",
        "torch" (an op of torch's own), "triton" or "reference" (dequantize, then F.linear)."""


class WeightDefaults:
    """The members most forms share: one format, its own form everywhere, not on the loop."""

    shape: tuple[int, int]
    format: str

    def formats(self) -> dict[str, int]:
        return {self.format: self.shape[0] * self.shape[1]}

    def linear_form(self) -> QuantWeight:
        return self

    def embedding_form(self) -> QuantWeight:
        return self

    def batch1_layout(self) -> Batch1Layout | None:
        return None
