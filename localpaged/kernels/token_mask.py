"""Grammar token masks on logits: refused tokens' logits set to -inf, in place.

A mask is packed as xgrammar packs it (engine/grammar.py): int32 [S, ceil(V / 32)], bit j of
word w allows token 32 w + j. On CPU the extension's kernel (kernels/cpu_mask.cpp) reads whole
words where it can; elsewhere, and until the extension is built, `reference` (plain torch) does
the same.
"""

from __future__ import annotations

import torch

from localpaged.kernels import cpu_extension

# Byte value -> its 8 bits, lowest first: unpacking is one gather per byte.
_BYTE_BITS = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).bool()


def mask_logits_(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [S, V] float32 with the tokens bitmask [S, W] refuses at -inf; returned."""
    module = cpu_extension.BUILD.module if logits.device.type == "cpu" else None
    if module is None or logits.dtype != torch.float32 or logits.stride(-1) != 1:
        return reference(logits, bitmask)
    module.mask_logits_(logits, bitmask.contiguous())
    return logits


def reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """The plain-torch twin of the kernel."""
    bitmask = bitmask.to(logits.device)
    table = _BYTE_BITS.to(logits.device)
    rows = bitmask.shape[0]
    allowed = table[bitmask.contiguous().view(torch.uint8).long()].reshape(rows, -1)
    return logits.masked_fill_(~allowed[:, :logits.shape[-1]], float("-inf"))
