"""Linear: nn.Linear whose float32 one-row products (batch-1 decode) use every CPU thread.

torch's CPU float32 `F.linear` on a single row (a GEMV) runs on one thread whatever
`torch.get_num_threads()` says. The same product taken as a batched matmul over P blocks of the
weight's rows (`bmm`, one block per thread, no copy: the blocks are views) streams the weights
on every thread (docs/benchmarks.md, 'The CPU paths, piece by piece', has the measured
bandwidths).
bfloat16 `F.linear` is threaded already (the split gains nothing there) and keeps its path.

Each output element is still one dot product over the same inputs, and for the shapes of real
models the BLAS computes it the same way in both forms: the result is bitwise equal to
`F.linear`. That is a property of the kernel paths, not a law (tiny or oddly sized blocks take
another path and round differently), so each module checks it once per thread count on its own
weight, against `F.linear`, and keeps `F.linear` where the two differ. Rows M > 1 (prefill,
batched decode) are already multi-threaded and go to `F.linear`.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)


def row_blocks(weight: torch.Tensor, parts: int) -> torch.Tensor:
    """weight [N, K] as `parts` blocks of its rows, [parts, K, N / parts]: views, no copy."""
    n, k = weight.shape
    return weight.view(parts, n // parts, k).transpose(1, 2)


def times_blocks(x: torch.Tensor, blocks: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [1, K] times the weight given as row_blocks (+ bias): [1, N] in one bmm."""
    parts, k, rows = blocks.shape
    y = torch.bmm(x.expand(parts, 1, k), blocks).view(1, parts * rows)
    return y if bias is None else y + bias


def split_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               parts: int) -> torch.Tensor:
    """x [1, K] @ weight[N, K].T (+ bias) as `parts` row blocks of the weight in one bmm."""
    return times_blocks(x, row_blocks(weight, parts), bias)


def split_is_exact(weight: torch.Tensor, bias: torch.Tensor | None, parts: int) -> bool:
    """Whether split_rows equals F.linear bitwise on this weight (random rows, fixed seed)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1, weight.shape[1], generator=gen).to(weight.dtype)
    return all(torch.equal(F.linear(row, weight, bias), split_rows(row, weight, bias, parts))
               for row in x)


class Linear(nn.Linear):
    """nn.Linear (same parameters and state dict) with the threaded one-row path above."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # threads -> (weight address, its row blocks, or None where the split is not exact)
        self._split: dict[int, tuple[int, torch.Tensor | None]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.get_num_threads()
        blocks = None
        if x.shape[0] == 1 and x.dim() == 2 and parts >= 2 and not x.is_cuda:
            blocks = self.split_blocks(parts)
        if blocks is None:
            return F.linear(x, self.weight, self.bias)
        return times_blocks(x, blocks, self.bias)

    def split_blocks(self, parts: int) -> torch.Tensor | None:
        """The weight's row blocks for the threaded one-row path at `parts` threads, or None
        where that path is off: not float32, rows not divisible, or not bitwise exact. Checked
        once per thread count and weight (the loader may replace or tie the weight)."""
        w = self.weight
        cached = self._split.get(parts)
        if cached is None or cached[0] != w.data_ptr():
            ok = (w.dtype == torch.float32 and w.shape[0] % parts == 0 and w.is_contiguous()
                  and split_is_exact(w.detach(), None if self.bias is None else self.bias.detach(), parts))
            cached = self._split[parts] = (w.data_ptr(), row_blocks(w.detach(), parts) if ok else None)
            logger.debug("Linear %s: threaded one-row path %s", tuple(w.shape), "on" if ok else "off")
        return cached[1]
