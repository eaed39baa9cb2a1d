"""The int4 tiles layout that kernels/cpu_int4.cpp reads, and the packing into it.

packed int32 [N / 32, K / 8, 2, 16]: each block of BLOCK = 32 output rows is one sequential
stream; a 32-bit word holds CHUNK = 8 consecutive inputs of one row (the .cpp says which bits
hold which weight). Scales and mins are float16 [K / G, N] beside it:
w[n, k] = q[n, k] * scales[k // G, n] + mins[k // G, n].
"""

from __future__ import annotations

import torch

BLOCK, CHUNK = 32, 8                 # output rows per block, inputs per 32-bit word
# bit offset of weight j (0..7) of a chunk in its word: pairs (2p, 2p + 1) at 4p and 16 + 4p
_SHIFTS = torch.tensor([0, 16, 4, 20, 8, 24, 12, 28], dtype=torch.int64)


def fits(N: int, K: int, group_size: int) -> bool:
    """Whether the kernel takes an [N, K] int4 weight with this group size."""
    return N % BLOCK == 0 and group_size % CHUNK == 0 and K % group_size == 0


def pack(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] int (0..15) -> packed int32 [N / 32, K / 8, 2, 16]."""
    N, K = q.shape
    blocks = q.view(N // BLOCK, 2, 16, K // CHUNK, CHUNK).permute(0, 3, 1, 2, 4)
    words = (blocks.to(torch.int64) << _SHIFTS).sum(-1)          # disjoint bit fields: an OR
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
