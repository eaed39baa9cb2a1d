"""kernels/cpu_mask.cpp and kernels/token_mask.py's reference: refused tokens' logits at -inf
under packed grammar masks, against a mask of one bool per token built bit by bit in Python,
and against xgrammar's own kernel; words all refused, all allowed and mixed, bit 31 (the
sign), a vocabulary that ends inside a word, and rows that are views of a larger tensor."""

import pytest
import torch
import xgrammar as xgr

from localpaged.kernels import token_mask


def plain_mask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.tensor([[bool((int(w) >> j) & 1) for w in row.tolist() for j in range(32)][:vocab]
                         for row in bitmask])


def masks(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (rows, words), dtype=torch.int32, generator=g)
    kind = torch.randint(0, 3, (rows, words), generator=g)      # refused, allowed, mixed
    bitmask[kind == 0] = 0
    bitmask[kind == 1] = -1
    bitmask[0, 0] = -2**31                 # only token 31 allowed in the first word
    return bitmask


@pytest.mark.parametrize("rows, vocab", [(1, 64), (3, 70), (5, 1000), (2, 49152)])
def test_the_kernel_and_the_reference_equal_a_bool_per_token(cpu_ext, rows, vocab):
    bitmask = masks(rows, vocab, seed=vocab)
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows))
    want = logits.masked_fill(~plain_mask(bitmask, vocab), float("-inf"))
    kernel = logits.clone()
    cpu_ext.mask_logits_(kernel, bitmask)
    assert torch.equal(kernel, want)
    assert torch.equal(token_mask.reference(logits.clone(), bitmask), want)
    assert torch.equal(token_mask.mask_logits_(logits.clone(), bitmask), want)
    theirs = logits.clone()
    xgr.apply_token_bitmask_inplace(theirs, bitmask, vocab_size=vocab)
    assert torch.equal(theirs, want)


def test_rows_that_are_views(cpu_ext):
    big = torch.randn(4, 100)
    bitmask = masks(2, 100, seed=1)
    view = big[1:3]
    want = view.masked_fill(~plain_mask(bitmask, 100), float("-inf"))
    cpu_ext.mask_logits_(view, bitmask)
    assert torch.equal(big[1:3], want)


def test_bad_shapes_are_refused(cpu_ext):
    with pytest.raises(RuntimeError, match="bitmask"):
        cpu_ext.mask_logits_(torch.zeros(2, 100), torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="float32"):
        cpu_ext.mask_logits_(torch.zeros(2, 64, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.int32))
