"""kernels/cpu_int4.cpp and quant/cpu_tiles.py: the CPU extension's int4 matmul against float32 math
on bf16(x) and the weights as stored (float16 scales and mins): shapes, group sizes, batch sizes;
a row's result is bitwise the same alone, in a batch and on any thread count; bad input is
refused; and the form a model's int4 weights take (the extension's where it is built and the
shape fits, torch's otherwise, never waiting for a first build)."""

import pytest
import torch
import torch.nn.functional as F

from localpaged.kernels import cpu_extension
from localpaged.quant import cpu_tiles
from localpaged.quant.cpu import CpuInt4Weight, for_cpu
from localpaged.quant.cpu_tiles import CpuInt4Tiles
from localpaged.quant.layout import quantize_int4
from localpaged.quant.linear import quant_linear


@pytest.fixture(scope="module")
def tiles_ready(cpu_ext):
    if not cpu_ext.int4_vectorized():
        pytest.skip("this CPU has no AVX-512 BF16: int4 weights take torch's form")


def stored(pw):
    """The weights as the tiles form stores them: float16 scales and mins."""
    q = pw.int_values().float()
    G = pw.group_size
    return (q * pw.scales.half().float().repeat_interleave(G, 1)
            + pw.mins.half().float().repeat_interleave(G, 1))


@pytest.mark.parametrize("N, K, G", [(32, 64, 32), (96, 576, 32), (64, 256, 128), (160, 192, 64),
                                     (64, 1536, 32)])
@pytest.mark.parametrize("M", [1, 5, 40])
def test_equals_float32_math_on_the_stored_weights(tiles_ready, N, K, G, M):
    pw = quantize_int4(torch.randn(N, K), G)
    tiles = CpuInt4Tiles.from_packed(pw)
    x = torch.randn(M, K)
    want = F.linear(x.bfloat16().float(), stored(pw))
    got = tiles.matmul(x)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    assert torch.allclose(tiles.dequantize(), stored(pw), atol=1e-5)


def test_a_row_alone_in_a_batch_and_on_any_thread_count_is_bitwise_the_same(tiles_ready):
    tiles = CpuInt4Tiles.from_packed(quantize_int4(torch.randn(320, 512), 32))
    x = torch.randn(37, 512)
    batched = tiles.matmul(x)
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            assert torch.equal(tiles.matmul(x), batched)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.cat([tiles.matmul(x[i:i + 1]) for i in range(37)]), batched)


@pytest.mark.parametrize("case, message", [("float16 x", "float32"), ("K", "packed"),
                                           ("scales", "float16"), ("group", "group size")])
def test_bad_input_is_refused(tiles_ready, case, message):
    t = CpuInt4Tiles.from_packed(quantize_int4(torch.randn(64, 128), 32))
    x, scales, group = torch.randn(2, 128), t.scales, 32
    if case == "float16 x":
        x = x.half()
    elif case == "K":
        x = torch.randn(2, 96)
    elif case == "scales":
        scales = scales.float()
    else:
        group = 12
    with pytest.raises(RuntimeError, match=message):
        cpu_extension.BUILD.module.int4_matmul(x, t.packed, scales, t.mins, group)


def test_int4_weights_take_the_tiles_form_where_it_fits(tiles_ready):
    fits = for_cpu(quantize_int4(torch.randn(64, 96), 32))
    assert isinstance(fits, CpuInt4Tiles) and fits.format == "int4 g32"
    odd = for_cpu(quantize_int4(torch.randn(48, 96), 32))         # N % 32 != 0: torch's form
    assert isinstance(odd, CpuInt4Weight)
    x = torch.randn(3, 96)
    assert quant_linear(x, fits).dtype == torch.float32


def test_without_the_extension_int4_weights_take_torch_form(monkeypatch):
    monkeypatch.setattr(cpu_tiles, "available", lambda: False)
    assert isinstance(for_cpu(quantize_int4(torch.randn(64, 96), 32)), CpuInt4Weight)


def test_a_first_build_is_not_waited_for_a_cached_one_is(monkeypatch):
    started = []
    build = cpu_extension.Build()
    monkeypatch.setattr(build, "start", lambda: started.append(True))   # never finishes
    monkeypatch.setattr(cpu_extension, "_built_before", lambda: False)
    assert build.module_if_cached(timeout=60) is None and started
    monkeypatch.setattr(cpu_extension, "_built_before", lambda: True)
    build.module = "the module"
    build.done.set()
    assert build.module_if_cached(timeout=60) == "the module"


def test_built_before_looks_where_torch_caches_the_build(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert not cpu_extension._built_before()
    (tmp_path / cpu_extension._name() / f"{cpu_extension._name()}.so").write_bytes(b"")
    assert cpu_extension._built_before()


def test_activations_round_to_bf16_as_torch_rounds(tiles_ready):
    """The kernel rounds x to bf16 itself; torch's rounding first changes nothing, bitwise
    (ties and tiny values included)."""
    tiles = CpuInt4Tiles.from_packed(quantize_int4(torch.randn(64, 256), 32))
    x = torch.randn(9, 256) * torch.logspace(-40, 30, 9)[:, None]
    x[0, :8] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 2 ** -130, 0.0, -0.0,
                             1e38, -1e38])                    # halfway cases, denormal, signs
    assert torch.equal(tiles.matmul(x), tiles.matmul(x.bfloat16().float()))
