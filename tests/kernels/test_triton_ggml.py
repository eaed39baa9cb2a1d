"""The Triton matmul over GGUF block formats (kernels/triton_ggml.py) against x @ dequantize(w).T
with the torch reference of each format (kernels/ggml_reference.py, bit-exact with gguf-py).

The CPU cases run under the Triton interpreter (TRITON_INTERPRET=1, set by tests/conftest.py);
the CUDA cases (larger shapes, bf16, the engine on a GGUF file) skip without a GPU.
Random bytes make every code, sub-scale and bit field appear, so a misplaced bit or byte is an
O(1) error; the fp16 scales are finite (ggml_reference.random_blocks). Tolerance: 1e-5 of the
output's largest magnitude in float32 (same products, a different order of the float32 sums),
1e-2 in bf16 / fp16 (the inputs' rounding).
"""

import os

import torch  # does not import triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # tests/conftest.py normally did this

import pytest  # noqa: E402

from localpaged.kernels import ggml_reference as ref  # noqa: E402
from localpaged.kernels import triton_common, triton_ggml  # noqa: E402
from localpaged.quant.ggml import GgmlWeight, NativeKernel  # noqa: E402
from localpaged.runner.startup_check import ggml_kernel_mismatch  # noqa: E402

INTERPRETED = triton_common.is_interpreted(triton_ggml._ggml_kernel)
CPU = pytest.mark.skipif(not INTERPRETED, reason="Triton kernels need TRITON_INTERPRET=1 on CPU")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
KINDS = sorted(ref.FORMATS)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.float() - want).abs().max().item() / want.abs().max().item()


def case(kind: str, M: int, N: int, K: int, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    data = ref.random_blocks(kind, N, K, g)
    x = torch.randn(M, K, generator=g)
    return x.to(device), data.to(device), x @ ref.dequantize(data, kind).T


@CPU
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("M", [1, 20])
def test_every_format_matches_the_reference(kind, M):
    """GEMV programs (M <= 8) and tl.dot tiles (M = 20, a partial tile), N = 40 not a multiple
    of any BLOCK_N, K = 512: two 256-element super-blocks, sixteen 32-element blocks."""
    x, data, want = case(kind, M, 40, 512, seed=M)
    got = triton_ggml.ggml_matmul(x, data, ref.FORMATS[kind].type_id)
    assert got.shape == (M, 40) and got.dtype == torch.float32
    assert rel_err(got, want) < 1e-5, kind


@CPU
@pytest.mark.parametrize("kind", ["Q4_K", "Q5_1"])
def test_rows_padded_to_a_power_of_two(kind):
    x, data, want = case(kind, 3, 40, 256, seed=3)
    assert rel_err(triton_ggml.ggml_matmul(x, data, ref.FORMATS[kind].type_id), want) < 1e-5


@CPU
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_half_precision_activations(kind):
    x, data, want = case(kind, 17, 24, 256)
    for dtype in (torch.float16, torch.bfloat16):
        got = triton_ggml.ggml_matmul(x.to(dtype), data, ref.FORMATS[kind].type_id)
        assert got.dtype == dtype and rel_err(got, want) < 1e-2, (kind, dtype)


@CPU
def test_rows_further_apart_than_row_bytes():
    """A view of every other row (stride 2 x row_bytes) reads the same as a copy."""
    x, data, _ = case("Q4_K", 2, 16, 256)
    strided = data.repeat_interleave(2, dim=0)[::2]
    assert strided.stride(0) == 2 * data.shape[1]
    tid = ref.FORMATS["Q4_K"].type_id
    assert torch.equal(triton_ggml.ggml_matmul(x, strided, tid), triton_ggml.ggml_matmul(x, data, tid))


def test_bad_arguments_are_named():
    x, data, _ = case("Q4_0", 1, 4, 64)
    with pytest.raises(ValueError, match="Q4_0 rows of K=32 hold 18 bytes"):
        triton_ggml.ggml_matmul(x[:, :32], data, ref.FORMATS["Q4_0"].type_id)
    with pytest.raises(ValueError, match="not F16"):
        triton_ggml.ggml_matmul(x, data, ref.PLAIN_FORMATS["F16"].type_id)
    with pytest.raises(ValueError, match="not supported"):
        triton_ggml.ggml_matmul(x, data, 99)


@CPU
def test_the_startup_check_passes_the_kernel_and_names_a_broken_one():
    assert ggml_kernel_mismatch(triton_ggml.ggml_matmul, torch.device("cpu")) is None

    def off_in_q6_k(x, data, type_id):       # wrong for one format only
        y = triton_ggml.ggml_matmul(x, data, type_id)
        return y * 1.01 if type_id == ref.FORMATS["Q6_K"].type_id else y
    problem = ggml_kernel_mismatch(off_in_q6_k, torch.device("cpu"))
    assert problem is not None and problem.startswith("Q6_K (M=1) differs"), problem


def test_a_weight_keeps_only_a_kernel_made_for_its_device():
    calls = []

    def spy(x, data, type_id):
        calls.append(type_id)
        return x @ ref.dequantize(data, "Q8_0").T
    x, data, want = case("Q8_0", 2, 8, 64)
    for device_type in ("cpu", "meta"):
        w = GgmlWeight("Q8_0", data, (8, 64), NativeKernel(spy, frozenset({"Q8_0"}), device_type))
        assert (w.to("meta").native is not None) == (device_type == "meta")
        calls.clear()
        assert rel_err(w.matmul(x), want) < 1e-6       # the kernel, or dequantize-then-matmul
        assert bool(calls) == (device_type == "cpu")


@CUDA
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_matches_the_reference(kind):
    for M in (1, 4, 16, 300):
        x, data, want = case(kind, M, 1000, 2048, seed=M, device="cuda")
        tid = ref.FORMATS[kind].type_id
        assert rel_err(triton_ggml.ggml_matmul(x, data, tid), want.cuda()) < 1e-4, (kind, M)
        got = triton_ggml.ggml_matmul(x.bfloat16(), data, tid)
        assert rel_err(got, want.cuda()) < 2e-2, (kind, M)


@CUDA
def test_cuda_startup_check_and_a_gguf_file_in_its_own_formats():
    from localpaged import LLM, SamplingParams
    from localpaged.runner.startup_check import triton_ggml_native
    from tests.test_ggml_engine import committed
    native = triton_ggml_native(torch.device("cuda"))
    assert native is not None and native.device_type == "cuda"
    path = committed("Q4_K_M")
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompt = list(range(5, 30))
    on_gpu = LLM(path, device="cuda", dtype="float32", num_kv_blocks=32)
    weights = [m.packed for m in on_gpu.engine.model.modules() if hasattr(m, "packed")]
    assert any(isinstance(w, GgmlWeight) and w.native is native or
               getattr(w, "native", None) is not None for w in weights)
    gpu_ids = on_gpu.generate([prompt], params)[0].outputs[0].token_ids
    cpu_ids = LLM(path, device="cpu", num_kv_blocks=32).generate([prompt], params)[0].outputs[0].token_ids
    assert gpu_ids == cpu_ids
