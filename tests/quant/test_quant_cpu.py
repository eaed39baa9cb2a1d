"""CPU quantized matmul paths (localpaged.quant.linear) against the dequantize-then-matmul torch reference.

Tolerances: a canonical int4 / grouped int8 PackedWeight whose matmul runs on CPU runs the
fallback (dequantize, then float matmul), so it must match `F.linear(x, pw.dequantize())` to float
rounding (1e-5 relative to the output's scale; bf16: 2e-2, one bf16 ulp is 2^-8). The CPU forms
(quant/cpu.py: torch's packed int4 and int8 ops) compute on bf16(x) with bf16 scales and a bf16
result: the oracle is float32 math on bf16(x) and the canonical weights, tolerance 1e-2 relative to
the output's max (bf16 rounding of the result, scales and zeros).
"""

import pytest
import torch
import torch.nn.functional as F

from localpaged.quant.layout import PackedWeight, cat_rows, pack_int4, quantize_int4, quantize_int8
from localpaged.quant.cpu import CpuInt4Weight

SHAPES = [(48, 96), (80, 256), (16, 384)]     # ragged N, K a multiple of 32 (and of 128 for g128)
GROUPED = [(N, K, G) for N, K in SHAPES for G in (32, 128) if K % G == 0]   # int4 shapes


def _close(y, ref, rtol):
    scale = ref.abs().max().item()
    assert (y.float() - ref).abs().max().item() <= rtol * scale, (y.float() - ref).abs().max()


def test_int4_nibble_order_and_dequantize():
    q = torch.tensor([[1, 2, 15, 0] + [7] * 28])            # K = 32, one group
    packed = pack_int4(q.to(torch.uint8))
    assert packed[0, 0].item() == 1 | (2 << 4) and packed[0, 1].item() == 15
    pw = PackedWeight(4, 32, packed, torch.tensor([[0.5]]), torch.tensor([[-1.0]]), (1, 32))
    assert pw.dequantize()[0, :4].tolist() == [-0.5, 0.0, 6.5, -1.0]


@pytest.mark.parametrize("N,K,G", GROUPED)
def test_quantize_int4_error_bound(N, K, G):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=g)
    pw = quantize_int4(w, G, scale_dtype=torch.float32)
    step = pw.scales.repeat_interleave(G, 1)
    assert ((pw.dequantize() - w).abs() <= step / 2 + 1e-5).all()


def test_quantize_int8_error_bound():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 72, generator=g)
    pw = quantize_int8(w)
    assert ((pw.dequantize() - w).abs() <= pw.scales[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("N,K,G", GROUPED)
@pytest.mark.parametrize("M", [1, 37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_matches_reference(N, K, G, M, dtype):
    g = torch.Generator().manual_seed(0)
    pw = quantize_int4(torch.randn(N, K, generator=g), G)
    x = torch.randn(M, K, generator=g).to(dtype)
    y = pw.matmul(x)
    assert y.dtype == dtype and y.shape == (M, N)
    _close(y, F.linear(x.float(), pw.dequantize()), 1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("M", [1, 8, 37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_matches_reference(N, K, M, dtype):
    g = torch.Generator().manual_seed(0)
    pw = quantize_int8(torch.randn(N, K, generator=g))
    x = torch.randn(M, K, generator=g).to(dtype)
    y = pw.matmul(x)
    assert y.dtype == dtype and y.shape == (M, N)
    ref = F.linear(x.to(torch.bfloat16).float(), pw.dequantize())
    _close(y, ref, 1e-2)


@pytest.mark.parametrize("make", [lambda w: (quantize_int8(w)).cpu_form(),
                                  lambda w: (quantize_int4(w, 32)).cpu_form()], ids=["int8", "int4"])
def test_cpu_forms_rows_do_not_depend_on_batch(make):
    """One kernel per weight for every M: a row's value is the same alone or in a batch of 37
    (what keeps batching from changing greedy output)."""
    g = torch.Generator().manual_seed(0)
    pw = make(torch.randn(96, 160, generator=g))
    x = torch.randn(37, 160, generator=g)
    big = pw.matmul(x)
    small = torch.cat([pw.matmul(x[i:i + 1]) for i in range(37)])
    assert torch.equal(small, big)


@pytest.mark.parametrize("N,K,G", GROUPED)
@pytest.mark.parametrize("M", [1, 37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_int4_form_matches_reference(N, K, G, M, dtype):
    g = torch.Generator().manual_seed(0)
    pw = quantize_int4(torch.randn(N, K, generator=g), G)
    cpu = pw.cpu_form()
    assert isinstance(cpu, CpuInt4Weight) and cpu.nbytes < pw.nbytes * 1.15
    x = torch.randn(M, K, generator=g).to(dtype)
    y = cpu.matmul(x)
    assert y.dtype == dtype and y.shape == (M, N)
    _close(y, F.linear(x.to(torch.bfloat16).float(), pw.dequantize()), 1e-2)
    _close(cpu.dequantize(), pw.dequantize(), 1e-2)


def test_cpu_forms_of_odd_shapes_and_grouped_int8():
    g = torch.Generator().manual_seed(0)
    odd = quantize_int4(torch.randn(40, 64, generator=g), 32)   # N % 16 != 0: the fallback path
    assert odd.cpu_form() is odd
    q = torch.randint(-127, 128, (32, 64), dtype=torch.int8, generator=g)
    grouped = PackedWeight(8, 32, q, torch.rand(32, 2, generator=g).half(), None, (32, 64))
    per_channel = grouped.cpu_form()
    assert per_channel.per_channel and per_channel.scales.dtype == torch.bfloat16
    x = torch.randn(5, 64, generator=g)
    _close(per_channel.matmul(x), F.linear(x.to(torch.bfloat16).float(), grouped.dequantize()), 1e-2)


def test_grouped_int8_and_fusion():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (24, 64), dtype=torch.int8, generator=g)
    d = torch.rand(24, 2, generator=g).half()
    pw = PackedWeight(8, 32, q, d, None, (24, 64))
    ref = q.float() * d.float().repeat_interleave(32, 1)
    assert torch.equal(pw.dequantize(), ref)
    x = torch.randn(5, 64, generator=g)
    _close(pw.matmul(x), F.linear(x, ref), 1e-5)
    a, b = (quantize_int4(torch.randn(n, 64, generator=g)) for n in (8, 16))
    assert torch.equal(cat_rows([a, b]).dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    with pytest.raises(ValueError, match="quantized differently"):
        cat_rows([a, quantize_int8(torch.randn(4, 64, generator=g))])


def test_int4_group_must_divide_k():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="divisible by the group size 32"):
        quantize_int4(torch.randn(8, 48, generator=g), 32)
    with pytest.raises(ValueError, match="group_size must be one of"):
        quantize_int4(torch.randn(8, 64, generator=g), 16)


def test_group_int8_goes_per_channel_in_row_chunks_exactly():
    """cpu_form requantizes a group-wise int8 table (a GGUF's Q8_0 embedding) a chunk of rows at a
    time, to bound load memory; the oracle is quantize_int8 of the whole table dequantized."""
    from localpaged.quant.layout import per_channel_int8
    g = torch.Generator().manual_seed(0)
    N, K = 203, 96                                      # ragged: the last chunk is short
    pw = PackedWeight(8, 32, torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g),
                      torch.rand(N, K // 32, dtype=torch.float16, generator=g), None, (N, K))
    got, ref = per_channel_int8(pw, chunk_weights=7 * K), quantize_int8(pw.dequantize(torch.float32))
    assert got.shape == ref.shape and got.group_size == ref.group_size == K
    assert torch.equal(got.qweight, ref.qweight) and torch.equal(got.scales, ref.scales)
