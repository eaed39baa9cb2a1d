"""kernels/cpu_read.cpp, bench/machine.py's memory read: the bytes of a tensor summed as int64
(wrapping), over torch's threads, whatever the dtype; a tail under 8 bytes left out."""

import torch


def test_read_sum_is_the_int64_sum_of_the_bytes(cpu_ext):
    gen = torch.Generator().manual_seed(0)
    for n in (0, 7, 16, 1000, (1 << 18) * 16 + 24):          # tails; a part for each thread
        x = torch.randint(-2**62, 2**62, (n,), dtype=torch.int64, generator=gen)
        assert cpu_ext.read_sum(x) == int(x.sum())           # int64 sums wrap alike
    y = torch.randn(1001, generator=gen)                     # float32: 4004 bytes, 4 of them a tail
    assert cpu_ext.read_sum(y) == int(y[:1000].view(torch.int64).sum())
