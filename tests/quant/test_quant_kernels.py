"""Weight-only quantized matmul: the torch reference against Python-loop dequantization, and the
Triton kernels (localpaged.kernels.triton_quant_matmul) against the reference.

The CPU cases run the kernels under the Triton interpreter (TRITON_INTERPRET=1, set by
tests/conftest.py); the CUDA cases (larger shapes) skip without a GPU.

Weights are random floats quantized the way a loader does (int8: symmetric per output row;
int4: per group, scale = (max - min) / 15, min = group min), so outputs are O(1).
Tolerances (max abs and rel difference to the reference):
  fp32 activations: atol 1e-4, rtol 1e-4 (the kernel scales after the integer dot, the
      reference dequantizes first: same sums, different fp32 rounding; tl.dot in IEEE mode)
  fp16 / bf16:      atol 1e-2, rtol 1e-2 (the output rounding to 16 bits dominates)
Interpreter note: casting integers to bf16 and bf16 tl.dot are wrong under the interpreter
(bit patterns), so there the kernels upcast bf16 dot inputs to fp32 (triton_common.dot_options);
compiled kernels take the bf16 path, covered by the CUDA cases.
"""

import logging
import os

import torch  # does not import triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # tests/conftest.py normally did this

import pytest  # noqa: E402
import triton.language as tl  # noqa: E402

from localpaged.kernels import quant_reference as qref  # noqa: E402
from localpaged.kernels import triton_common as common  # noqa: E402
from localpaged.kernels import triton_quant_matmul as qmm  # noqa: E402
from localpaged.quant.layout import quantize_int4, quantize_int8  # noqa: E402
from localpaged.quant.layout import triton_linear  # noqa: E402

INTERPRETED = common.is_interpreted(qmm._decode_kernel) and common.is_interpreted(tl.zeros)
CPU = pytest.mark.skipif(not INTERPRETED, reason="Triton kernels need TRITON_INTERPRET=1 on CPU"
                         " (set before triton was imported)")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
TOL = {F32: (1e-4, 1e-4), F16: (1e-2, 1e-2), BF16: (1e-2, 1e-2)}


def quantize(w: torch.Tensor, bits: int, group_size: int | None, scale_dtype=F32):
    """(qweight, scales, mins) of w [N, K] in the canonical layout (see quant_reference)."""
    if bits == 8:
        scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-8)
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return q, scales.to(scale_dtype), None
    N, K = w.shape
    g = w.view(N, K // group_size, group_size)
    lo, hi = g.amin(dim=2), g.amax(dim=2)
    scales = ((hi - lo) / 15).clamp_min(1e-8).to(scale_dtype)
    mins = lo.to(scale_dtype)
    q = torch.round((g - mins.float()[..., None]) / scales.float()[..., None]).clamp(0, 15)
    q = q.to(torch.uint8).view(N, K)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    return packed.contiguous(), scales, mins


def make_case(seed, M, N, K, bits, group_size, dtype, scale_dtype=F32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=gen) / K ** 0.5
    x = torch.randn(M, K, generator=gen).to(dtype)
    q, s, mn = quantize(w, bits, group_size, scale_dtype)
    to = (lambda t: None if t is None else t.to(device))
    return to(x), to(q), to(s), to(mn)


def assert_close(actual, expected, dtype):
    atol, rtol = TOL[dtype]
    assert actual.dtype == expected.dtype == dtype
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), atol=atol, rtol=rtol)


# --- the reference against an independent oracle ---------------------------------------------

def test_reference_dequantize_matches_python_loops():
    gen = torch.Generator().manual_seed(0)
    N, K, G = 2, 64, 32
    packed = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    scales = torch.rand(N, K // G, generator=gen)
    mins = torch.randn(N, K // G, generator=gen)
    expected = torch.empty(N, K)
    for n in range(N):
        for j in range(K // 2):
            byte = int(packed[n, j])
            for k, nibble in ((2 * j, byte % 16), (2 * j + 1, byte // 16)):
                # fp32 scalar ops, each rounded as the reference's
                    expected[n, k] = nibble * scales[n, k // G] + mins[n, k // G]
    assert torch.equal(qref.dequantize_int4(packed, scales, mins, G), expected)
    assert qref.dequantize_int4(packed, scales.half(), mins.half(), G, F16).dtype == F16

    q8 = torch.randint(-128, 128, (N, 5), generator=gen, dtype=torch.int8)
    s8 = torch.rand(N, generator=gen)
    expected8 = torch.tensor([[int(q8[n, k]) * float(s8[n]) for k in range(5)]
                              for n in range(N)])   # one rounding, as in fp32
    assert torch.equal(qref.dequantize_int8(q8, s8), expected8)

    x = torch.randn(2, K, generator=gen)
    w = expected.double()
    y = qref.quant_matmul_reference(x, packed, scales, mins, G, 4)
    torch.testing.assert_close(y.double(), x.double() @ w.T, atol=1e-5, rtol=1e-5)


def test_test_quantizer_round_trips():
    """The quantizer these tests use lands within half a step of the original weights."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(4, 128, generator=gen)
    q, s, mn = quantize(w, 4, 32)
    err = (qref.dequantize_int4(q, s, mn, 32) - w).abs()
    assert bool((err <= s.repeat_interleave(32, 1) / 2 + 1e-6).all())
    q, s, _ = quantize(w, 8, None)
    assert bool(((qref.dequantize_int8(q, s) - w).abs() <= s[:, None] / 2 + 1e-6).all())


# --- the kernels against the reference (interpreter on CPU) -----------------------------------

# (M, N, K, bits, G, activation dtype, scale dtype): every M class, ragged N, both bit widths,
# every group size and activation dtype, fp16 scales and an int8 K that is no multiple of a tile.
CASES = [
    (1, 100, 192, 8, None, F32, F32), (1, 48, 256, 4, 32, F16, F32),
    (1, 100, 64, 4, 64, BF16, F16), (3, 48, 72, 8, None, BF16, F32),
    (3, 100, 256, 4, 128, F32, F32), (16, 48, 192, 4, 32, F32, F16),
    (17, 100, 192, 8, None, F16, F16), (17, 48, 256, 4, 64, BF16, F32),
    (40, 100, 256, 4, 32, F16, F32), (40, 48, 64, 8, None, F32, F32),
    (40, 100, 192, 4, 64, F32, F32), (40, 48, 256, 8, None, BF16, F32),
    (17, 100, 256, 4, 128, BF16, F16),
]


@CPU
@pytest.mark.parametrize("M,N,K,bits,G,dtype,sdtype", CASES)
def test_quant_matmul_matches_reference(M, N, K, bits, G, dtype, sdtype):
    args = make_case(M * 1000 + K + bits, M, N, K, bits, G, dtype, sdtype)
    expected = qref.quant_matmul_reference(*args, G, bits)
    assert_close(qmm.quant_matmul(*args, G, bits), expected, dtype)


@CPU
@pytest.mark.parametrize("M,bits,G,dtype", [(2, 8, None, F16), (2, 4, 32, BF16),
                                           (9, 4, 128, F32), (9, 8, None, BF16)])
def test_decode_split_k_and_small_tiles(M, bits, G, dtype):
    """Split-K (partials summed after; the last split shorter, its last unrolled tiles past K)
    and several N blocks, with broadcast-sum (M=2) and tl.dot (M=9) tiles."""
    N, K = 100, 288 if G != 128 else 384          # 288: 4.5 iterations of 2 x 32
    args = make_case(7 + bits, M, N, K, bits, G, dtype)
    out = qmm.quant_decode(*args, G, bits, block_n=32, sub_k=32, unroll=2, split_k=3)
    assert_close(out, qref.quant_matmul_reference(*args, G, bits), dtype)


@CPU
@pytest.mark.parametrize("bits,G", [(8, None), (4, 64)])
def test_prefill_kernel_small_m_and_tiles(bits, G):
    """The GEMM kernel is right for any M (M=3 in one partial m block, M=33 over three)."""
    for M in (3, 33):
        args = make_case(M, M, 48, 128, bits, G, F16)
        assert_close(qmm.quant_prefill(*args, G, bits, block_m=16, block_n=16, sub_k=32),
                     qref.quant_matmul_reference(*args, G, bits), F16)


@CPU
def test_zero_rows_and_non_contiguous_x():
    x, q, s, mn = make_case(3, 5, 48, 128, 4, 32, F32)
    assert qmm.quant_matmul(x[:0], q, s, mn, 32, 4).shape == (0, 48)
    wide = torch.randn(5, 2 * 128, generator=torch.Generator().manual_seed(2))
    x_nc = wide[:, ::2]                                  # unit stride broken along K
    expected = qref.quant_matmul_reference(x_nc.contiguous(), q, s, mn, 32, 4)
    assert_close(qmm.quant_matmul(x_nc, q, s, mn, 32, 4), expected, F32)
    s_nc, mn_nc = s.t().contiguous().t(), mn.t().contiguous().t()   # column-major groups
    assert_close(qmm.quant_prefill(x_nc, q, s_nc, mn_nc, 32, 4), expected, F32)


def test_cpu_without_interpreter_falls_back(monkeypatch, caplog):
    monkeypatch.setattr(common, "is_interpreted", lambda kernel: False)
    args = make_case(4, 2, 48, 64, 8, None, F32)
    common._logged.clear()
    with caplog.at_level(logging.INFO, logger=common.logger.name):
        out = qmm.quant_matmul(*args, None, 8)
    assert torch.equal(out, qref.quant_matmul_reference(*args, None, 8))
    assert any("TRITON_INTERPRET is off" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("change,match", [
    (dict(bits=3), "bits=3.*supported: \\(4, 8\\)"),
    (dict(group_size=48), "group_size=48.*supported: \\(32, 64, 128\\)"),
    (dict(K=96, group_size=64), "K \\(96\\) divisible by group_size \\(64\\)"),
    (dict(mins=None), "int4 needs mins"),
    (dict(x_dtype=torch.float64), "x dtype torch.float64 is not supported"),
    (dict(qweight_dtype=torch.int8), "int4 qweight must be uint8"),
    (dict(scales_device="meta"), "scales is on meta but x is on cpu"),
])
def test_bad_input_is_a_clear_value_error(change, match):
    K = change.get("K", 128)
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(0),
                    dtype=change.get("x_dtype", F32))
    q = torch.zeros(16, K // 2, dtype=change.get("qweight_dtype", torch.uint8))
    G = change.get("group_size", 32)
    s = mn = torch.ones(16, max(1, K // G))
    s = s.to(change.get("scales_device", "cpu"))
    mins = change["mins"] if "mins" in change else mn
    for fn in (qmm.quant_matmul, qref.quant_matmul_reference):
        with pytest.raises(ValueError, match=match):
            fn(x, q, s, mins, G, change.get("bits", 4))


# --- CUDA: compiled kernels, realistic shapes -------------------------------------------------

@CUDA
@pytest.mark.parametrize("bits,G,dtype", [(8, None, F16), (4, 32, BF16), (4, 128, F16),
                                          (4, 64, F32)])
def test_cuda_large_shapes(bits, G, dtype):
    """Compiled kernels on a realistic layer: M=1 (broadcast-sum), 16 (tl.dot decode) and 300
    (GEMM), with the split-K heuristic's choice and a forced split."""
    for M in (1, 16, 300):
        args = make_case(M + bits, M, 1000, 2048, bits, G, dtype, device="cuda")
        expected = qref.quant_matmul_reference(*args, G, bits)
        assert_close(qmm.quant_matmul(*args, G, bits), expected, dtype)
        if M <= qmm.DECODE_MAX_M:
            assert_close(qmm.quant_decode(*args, G, bits, split_k=3), expected, dtype)


@pytest.mark.parametrize("make", [
    lambda w: quantize_int4(w, 32),                                    # fp16 scales and mins
    lambda w: quantize_int4(w, 64, scale_dtype=torch.float32),        # float32 (GPTQ/AWQ loads)
    lambda w: quantize_int8(w),                                        # per channel, float32
], ids=["int4-g32-fp16", "int4-g64-fp32", "int8"])
def test_quant_linear_calls_the_triton_kernel_with_its_packed_weight(make):
    """localpaged.quant.linear.triton_linear (what CUDA runs) hands a PackedWeight's canonical
    tensors to the kernel correctly: equal to the dequantize-then-matmul reference."""
    pw = make(torch.randn(48, 128, generator=torch.Generator().manual_seed(3)))
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(4))
    y = triton_linear(x, pw)
    ref = x @ pw.dequantize(torch.float32).t()
    assert torch.allclose(y, ref, atol=1e-4, rtol=1e-4)
