"""kernels/cpu_int4.cpp and quant/cpu_tiles.py: the CPU extension's int4 matmul against float32 math
on bf16(x) and the weights as stored (float16 scales and mins): shapes, group sizes, batch sizes;
a row's result is bitwise the same alone, in a batch and on any thread count; bad input is
refused; and the form a model's int4 weights take (the extension's where it is built with
AVX-512 BF16 and the shape fits, torch's otherwise, never waiting for a first build).

The kernel tests run whichever path this CPU has: the AVX-512 BF16 one where /proc/cpuinfo lists
`avx512_bf16`, the portable loop otherwise (the extension is built with -march=native); a test
checks that the built path is the one the CPU has. Nothing here skips on a CPU feature."""

import logging
import os
import time

import pytest
import torch
import torch.nn.functional as F

from localpaged.kernels import cpu_extension
from localpaged.quant import cpu_tiles
from localpaged.quant.cpu import CpuInt4Weight
from localpaged.quant.cpu_tiles import CpuInt4Tiles
from localpaged.quant.layout import quantize_int4


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as Linux lists them (None where /proc/cpuinfo is not there)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f
                         if line.startswith("flags")), set())
    except OSError:
        return None


AVX512_BF16 = "avx512_bf16" in (cpu_flags() or ())     # the CPU feature the fast path needs


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def tiles_ready(cpu_ext):
    """The built extension, on whichever int4 path this CPU has (see the module docstring)."""
    return cpu_ext


@pytest.mark.skipif(cpu_flags() is None, reason="CPU feature flags: no /proc/cpuinfo to read")
def test_the_built_path_is_the_one_this_cpu_has(cpu_ext):
    assert cpu_ext.int4_vectorized() == AVX512_BF16, (
        f"CPU has AVX-512 BF16: {AVX512_BF16}; the extension's int4 kernel vectorized: "
        f"{cpu_ext.int4_vectorized()}")


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
    pw = quantize_int4(torch.randn(N, K, generator=gen(N + K)), G)
    tiles = CpuInt4Tiles.from_packed(pw)
    x = torch.randn(M, K, generator=gen(M))
    want = F.linear(x.bfloat16().float(), stored(pw))
    got = tiles.matmul(x)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    assert torch.allclose(tiles.dequantize(), stored(pw), atol=1e-5)


def test_a_row_alone_in_a_batch_and_on_any_thread_count_is_bitwise_the_same(tiles_ready):
    g = gen()
    tiles = CpuInt4Tiles.from_packed(quantize_int4(torch.randn(320, 512, generator=g), 32))
    x = torch.randn(37, 512, generator=g)
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
    g = gen()
    t = CpuInt4Tiles.from_packed(quantize_int4(torch.randn(64, 128, generator=g), 32))
    x, scales, group = torch.randn(2, 128, generator=g), t.scales, 32
    if case == "float16 x":
        x = x.half()
    elif case == "K":
        x = torch.randn(2, 96, generator=g)
    elif case == "scales":
        scales = scales.float()
    else:
        group = 12
    with pytest.raises(RuntimeError, match=message):
        cpu_extension.BUILD.module.int4_matmul(x, t.packed, scales, t.mins, group)


def test_int4_weights_take_the_tiles_form_where_it_fits(tiles_ready):
    """With AVX-512 BF16 the tiles form where the shape fits; without it torch's form always."""
    g = gen()
    fits = (quantize_int4(torch.randn(64, 96, generator=g), 32)).cpu_form()
    assert isinstance(fits, CpuInt4Tiles if AVX512_BF16 else CpuInt4Weight)
    assert fits.format == "int4 g32"
    odd = (quantize_int4(torch.randn(48, 96, generator=g), 32)).cpu_form()   # N % 32 != 0: torch's form
    assert isinstance(odd, CpuInt4Weight)
    x = torch.randn(3, 96, generator=g)
    assert fits.matmul(x).dtype == torch.float32


def test_without_the_extension_int4_weights_take_torch_form(monkeypatch):
    monkeypatch.setattr(cpu_tiles, "available", lambda: False)
    assert isinstance(quantize_int4(torch.randn(64, 96, generator=gen()), 32).cpu_form(),
                      CpuInt4Weight)


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


def test_another_march_is_built_and_cached_apart(monkeypatch):
    """LOCALPAGED_CPU_MARCH builds for another target (the benches' AVX2 path on a CPU with
    AVX-512) under its own name, so the native build is never replaced; a name that is not a
    target is refused, naming the variable."""
    monkeypatch.delenv("LOCALPAGED_CPU_MARCH", raising=False)
    native = cpu_extension._name()
    assert cpu_extension._march() == "native"
    monkeypatch.setenv("LOCALPAGED_CPU_MARCH", "haswell")
    assert cpu_extension._march() == "haswell" and cpu_extension._name() == native + "_haswell"
    monkeypatch.setenv("LOCALPAGED_CPU_MARCH", "x86-64-v3")
    assert cpu_extension._name() == native + "_x86_64_v3"
    monkeypatch.setenv("LOCALPAGED_CPU_MARCH", "native -O0")
    with pytest.raises(ValueError, match="LOCALPAGED_CPU_MARCH='native -O0' is not a -march target"):
        cpu_extension._name()


def test_a_build_lock_left_by_a_dead_build_is_removed(tmp_path, caplog):
    """torch's build waits on its `lock` file forever: an old one (a killed build) goes, a fresh
    one (a build running now) stays."""
    lock = tmp_path / "lock"
    assert not cpu_extension.clear_stale_lock(str(tmp_path))               # none: nothing to do
    lock.write_text("")
    assert not cpu_extension.clear_stale_lock(str(tmp_path)) and lock.exists()
    old = time.time() - cpu_extension.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    with caplog.at_level(logging.WARNING, logger=cpu_extension.__name__):
        assert cpu_extension.clear_stale_lock(str(tmp_path))
    assert not lock.exists() and "did not finish" in caplog.text


def test_activations_round_to_bf16_as_torch_rounds(tiles_ready):
    """The kernel rounds x to bf16 itself; torch's rounding first changes nothing, bitwise
    (ties and tiny values included; ±1e38 times the weights overflows, so row 0 may be NaN:
    compared as bits)."""
    g = gen()
    tiles = CpuInt4Tiles.from_packed(quantize_int4(torch.randn(64, 256, generator=g), 32))
    x = torch.randn(9, 256, generator=g) * torch.logspace(-40, 30, 9)[:, None]
    x[0, :8] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 2 ** -130, 0.0, -0.0,
                             1e38, -1e38])                    # halfway cases, denormal, signs
    bits = [tiles.matmul(v).view(torch.int32) for v in (x, x.bfloat16().float())]
    assert torch.equal(*bits)


def test_a_changed_header_changes_the_build_arguments(monkeypatch, tmp_path):
    """torch rebuilds a cached extension only when its sources or arguments change; the kernels'
    headers and fragments (.h, .inc: cpu_ggml.cpp's parts) go into the arguments as a digest."""
    monkeypatch.setattr(cpu_extension, "_HERE", str(tmp_path))
    (tmp_path / "part.h").write_text("int a;\n")
    (tmp_path / "tiles.inc").write_text("int c;\n")
    (tmp_path / "notes.txt").write_text("not a header\n")
    before = cpu_extension._headers_digest()
    (tmp_path / "notes.txt").write_text("still not a header\n")
    assert cpu_extension._headers_digest() == before
    (tmp_path / "part.h").write_text("int b;\n")
    changed = cpu_extension._headers_digest()
    assert changed != before
    (tmp_path / "tiles.inc").write_text("int d;\n")                # a fragment counts too
    assert cpu_extension._headers_digest() != changed
