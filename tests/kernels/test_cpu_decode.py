"""kernels/cpu_decode.cpp (the `cpu` backend's decode attention) against the torch reference:
grouped heads, head sizes, block sizes, blocks out of order, lengths around its 64-token chunks,
softmax extremes; a sequence's result is bitwise the same alone, in a batch and on any thread
count; bad block tables are refused; kernels/cpu_ops.py falls back to the reference where the
kernel does not serve."""

import pytest
import torch

from localpaged.kernels import cpu_extension, cpu_ops, reference


@pytest.fixture(scope="module")
def kernel(cpu_ext):
    return cpu_ext.paged_decode_attention


def paged(lens, heads, kv_heads, dim, block_size, seed=0, spread=1.0):
    """q [B, H, D], caches with 4 spare blocks, each sequence's blocks in shuffled order."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in lens]
    num_blocks = sum(per_seq) + 4
    k_cache, v_cache = (torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
                        for _ in range(2))
    ids = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.zeros(len(lens), max(per_seq) + 1, dtype=torch.int32)
    start = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = ids[start:start + n]
        start += n
    q = torch.randn(len(lens), heads, dim, generator=gen) * spread
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("heads, kv_heads, dim", [(9, 3, 64), (4, 4, 128), (8, 2, 32), (6, 3, 80)])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_equals_the_reference(kernel, heads, kv_heads, dim, block_size):
    q, k, v, tables, lens = paged([1, 63, 64, 65, 300], heads, kv_heads, dim, block_size)
    scale = dim ** -0.5
    got = kernel(q, k, v, tables, lens, scale)
    want = reference.paged_decode_attention(q, k, v, tables, lens, scale)
    assert (got - want).abs().max().item() < 2e-6


@pytest.mark.parametrize("spread", [0.0, 30.0])
def test_softmax_extremes(kernel, spread):
    """Equal scores (q = 0: the mean of V) and scores hundreds apart (one token dominates,
    others underflow). Scores in the hundreds carry float32 rounding of ~1e-5 in both."""
    q, k, v, tables, lens = paged([200, 97], 6, 2, 64, 16, seed=3, spread=spread)
    got = kernel(q, k, v, tables, lens, 0.125)
    want = reference.paged_decode_attention(q, k, v, tables, lens, 0.125)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max().item() < (2e-6 if spread == 0 else 1e-4)


def test_a_sequence_alone_in_a_batch_and_on_any_thread_count_is_bitwise_the_same(kernel):
    q, k, v, tables, lens = paged([500, 17, 130, 64], 9, 3, 64, 16, seed=5)
    batched = kernel(q, k, v, tables, lens, 0.125)
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            assert torch.equal(kernel(q, k, v, tables, lens, 0.125), batched)
    finally:
        torch.set_num_threads(threads)
    for i in range(len(lens)):
        alone = kernel(q[i:i + 1], k, v, tables[i:i + 1], lens[i:i + 1], 0.125)
        assert torch.equal(alone[0], batched[i])


@pytest.mark.parametrize("case, message", [("block id", "outside the cache"),
                                           ("too long", "block table capacity"),
                                           ("empty", "block table capacity"),
                                           ("float64", "float32")])
def test_bad_input_is_refused(kernel, case, message):
    q, k, v, tables, lens = paged([40, 20], 6, 2, 64, 16)
    if case == "block id":
        tables[1, 0] = k.shape[0]
    elif case == "too long":
        lens[0] = tables.shape[1] * 16 + 1
    elif case == "empty":
        lens[1] = 0
    else:               # bf16/fp16/int8 caches are served (kv_cache_dtype), float64 is not
        k, v = k.double(), v.double()
    with pytest.raises(RuntimeError, match=message):
        kernel(q, k, v, tables, lens, 0.125)


@pytest.mark.parametrize("case", ["head size 72", "float64 cache", "not built"])
def test_cpu_backend_uses_the_reference_where_the_kernel_does_not_serve(kernel, monkeypatch, case):
    q, k, v, tables, lens = paged([40, 20], 4, 2, 72 if case == "head size 72" else 64, 16)
    if case == "float64 cache":
        k, v = k.double(), v.double()
    if case == "not built":
        monkeypatch.setattr(cpu_extension.BUILD, "module", None)
    got = cpu_ops.paged_decode_attention(q, k, v, tables, lens, 0.125)
    assert torch.equal(got, reference.paged_decode_attention(q, k, v, tables, lens, 0.125))


def test_cpu_backend_uses_the_kernel(kernel):
    q, k, v, tables, lens = paged([40, 20], 4, 2, 64, 16)
    assert torch.equal(cpu_ops.paged_decode_attention(q, k, v, tables, lens, 0.125),
                       kernel(q, k, v, tables, lens, 0.125))
