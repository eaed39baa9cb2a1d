"""kernels/cpu_ggml.cpp: the CPU matmul over GGUF quantized blocks (kept as the file's bytes)
against float32 math on gguf-py's dequantization, the layout's spec, for every format it takes,
within the bound its int8 rounding of x allows; a row's result bitwise the same alone, in any
batch and on any thread count; rows lying apart; bad input refused, naming the type; the K
formats bitwise the same on every build, the others on the vector builds; the interleaved
layout (x8, Q4_K, Q5_K and Q6_K on the vector builds) as its torch reference says, and bitwise the
same y as GGUF's rows on every path (the batch-1 loop, tiles of 2-4 rows, AMX).

Every test runs on three builds: the CPU extension's (-march=native: the AVX2 path on x86-64
since Haswell / Zen, with AMX tiles on Intel since Sapphire Rapids for batches of 10 rows and
more), cpu_ggml.cpp alone with -march=x86-64 (SSE2: the plain C++ path), and, where the CPU has
AVX-512, cpu_ggml.cpp alone with -march=haswell (the AVX2 path without the compiler's AVX-512). The builds of the file alone
(with kernels/cpu_ggml_module.cpp, torch ops: 20-40 s on two cores) go to a temporary folder.
On a CPU that is not x86-64 those builds skip, saying so; on x86-64 only the comparison of
vector builds skips, where the CPU has one (no AVX-512: no haswell build)."""

import platform

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from localpaged.kernels import cpu_extension

# The formats and the byte offsets of their float16 scales (d, dmin) in a block.
HALVES = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
          T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
          T.IQ4_NL: (0,), T.IQ4_XS: (0,)}
TYPES = list(HALVES)
X86 = platform.machine().lower() in ("x86_64", "amd64")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f
                         if line.startswith("flags")), set())
    except OSError:
        return set()


def tiles_granted() -> bool:
    """Whether Linux gives this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, as
    the kernel asks for it): a sandbox may refuse, and then the kernel runs its AVX2 tiles."""
    import ctypes
    try:
        return ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) == 0   # x86-64 Linux
    except (OSError, AttributeError):
        return False


FLAGS = cpu_flags()
NATIVE_AVX2 = {"avx2", "fma", "f16c"} <= FLAGS
NATIVE_AMX = {"amx_tile", "amx_int8", "avx512bw", "avx512vl"} <= FLAGS and X86 and tiles_granted()
BUILDS = ["native", "x86-64"] + (["haswell"] if "avx512f" in FLAGS else [])
NATIVE_VNNI = "avx_vnni" in FLAGS or {"avx512_vnni", "avx512vl"} <= FLAGS
NATIVE_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= FLAGS
EXPECTED_PATH = {"native": ("avx2" + "+vnni" * NATIVE_VNNI + "+avx512" * NATIVE_AVX512
                            + "+amx" * NATIVE_AMX) if NATIVE_AVX2 else "scalar",
                 "x86-64": "scalar", "haswell": "avx2"}
K_TYPES = [t for t in TYPES if gguf.GGML_QUANT_SIZES[t][0] == 256]


class Kernels:
    """ggml_matmul & co. of one build: the extension's module or torch ops of a build alone."""

    def __init__(self, name: str, ops) -> None:
        self.name, self.ops = name, ops

    def matmul(self, x, w, qtype):
        return self.ops.ggml_matmul(x, w, int(qtype))

    def path(self) -> str:
        return self.ops.ggml_kernel_path()

    def supported(self, type_id: int) -> bool:
        return self.ops.ggml_supported(type_id)

    def interleaved_types(self) -> list[int]:
        return list(self.ops.ggml_interleaved_types())

    def interleave(self, w, qtype) -> torch.Tensor:
        out = torch.empty_like(w)
        self.ops.ggml_interleave(w, int(qtype), out)
        return out

    def matmul_x8(self, x, w, qtype):
        return self.ops.ggml_matmul(x, w, int(qtype) | self.ops.ggml_interleaved_flag())


def build_alone(march: str, folder) -> Kernels:
    """cpu_ggml.cpp with its torch-ops binding, compiled for `march` into `folder`."""
    from torch.utils.cpp_extension import load
    name = "localpaged_ggml_" + march.replace("-", "_")
    here = cpu_extension._HERE
    load(name, [f"{here}/cpu_ggml.cpp", f"{here}/cpu_ggml_module.cpp"], extra_include_paths=[here],
         extra_cflags=["-O3", f"-march={march}", "-fopenmp"], extra_ldflags=["-fopenmp"],
         build_directory=str(folder), is_python_module=False, verbose=False)
    return Kernels(march, getattr(torch.ops, name))


@pytest.fixture(scope="module")
def build_of(cpu_ext, tmp_path_factory):
    """name -> the Kernels of that build, each built once for the module."""
    built = {"native": Kernels("native", cpu_ext)}

    def get(name: str) -> Kernels:
        if name not in built:
            if not X86:
                pytest.skip(f"-march={name} is an x86-64 target; this CPU is {platform.machine()}")
            built[name] = build_alone(name, tmp_path_factory.mktemp(f"ggml-{name}"))
        return built[name]
    return get


@pytest.fixture(scope="module", params=BUILDS)
def ggml(request, build_of) -> Kernels:
    return build_of(request.param)


def blocks(qtype, N: int, K: int, seed: int) -> torch.Tensor:
    """uint8 [N, row_bytes] of random blocks whose float16 scales are sane: |d| in [1e-3, 0.1]."""
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 256, (N, K // elems, size), dtype=torch.uint8, generator=g)
    for offset in HALVES[qtype]:
        sign = torch.randint(0, 2, (N, K // elems), generator=g) * 2 - 1
        d = (torch.rand(N, K // elems, generator=g) * 0.099 + 1e-3) * sign
        w[:, :, offset:offset + 2] = d.half().view(torch.uint8).view(N, K // elems, 2)
    return w.reshape(N, -1)


def dequantized(w: torch.Tensor, qtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(w.numpy(), qtype)))


def bound(x: torch.Tensor, W: torch.Tensor, qtype) -> torch.Tensor:
    """cpu_ggml.cpp's tolerance: sum_k |W[n, k]| * max|x over k's block| / 254 (x rounded to int8
    per block of 256 for the K formats, of 32 otherwise), plus float32 rounding."""
    group = 256 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 32
    amax = x.abs().reshape(x.shape[0], -1, group).amax(-1).repeat_interleave(group, 1)
    return (amax.double() @ W.abs().double().T) / 254 + 1e-5 * (x.abs().double() @ W.abs().double().T)


def shapes(qtype):
    """(M, N, K): M across tiles of 4 rows, N of no particular multiple, K of 1 .. 16 blocks."""
    elems = gguf.GGML_QUANT_SIZES[qtype][0]
    counts = (1, 2, 3, 5) if elems == 256 else (1, 3, 9, 16)
    return [(M, N, elems * c) for (M, N), c in zip([(1, 5), (3, 7), (8, 33), (37, 10)], counts)]


def test_the_build_runs_the_path_its_instruction_set_has(ggml):
    assert ggml.path() == EXPECTED_PATH[ggml.name]


def test_it_takes_the_listed_formats_and_no_other(ggml):
    assert [t for t in range(64) if ggml.supported(t)] == sorted(int(t) for t in TYPES)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_equals_float_math_on_the_dequantized_weights_within_the_bound(ggml, qtype):
    for i, (M, N, K) in enumerate(shapes(qtype)):
        w = blocks(qtype, N, K, seed=i)
        W = dequantized(w, qtype)
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(100 + i))
        got = ggml.matmul(x, w, qtype)
        assert got.dtype == torch.float32 and got.shape == (M, N)
        err = (got.double() - x.double() @ W.double().T).abs()
        limit = bound(x, W, qtype)
        assert bool((err <= limit).all()), (
            f"{qtype.name} M={M} N={N} K={K}: error {err.max().item():.3g}, "
            f"{(err / limit).max().item():.2f} of the bound")


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_0], ids=lambda t: t.name)
def test_a_zero_row_gives_zeros_and_a_one_hot_row_a_column(ggml, qtype):
    """x = 0: y = 0 exactly; x = c e_k: c itself rounds to +-127 s, so y = c W[:, k] up to float
    rounding (of the scale terms, which may cancel: atol relative to c max|W|)."""
    elems = gguf.GGML_QUANT_SIZES[qtype][0]
    K = 2 * elems if elems == 256 else 8 * elems
    w = blocks(qtype, 9, K, seed=7)
    W = dequantized(w, qtype)
    x = torch.zeros(3, K)
    x[1, 5], x[2, K - 1] = 3.5, -0.02
    got = ggml.matmul(x, w, qtype)
    assert torch.equal(got[0], torch.zeros(9))
    for row, k in ((1, 5), (2, K - 1)):
        want = x[row, k] * W[:, k]
        atol = 1e-5 * abs(x[row, k].item()) * W.abs().max().item()
        assert torch.allclose(got[row], want, rtol=1e-5, atol=atol), (got[row], want)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_row_is_bitwise_the_same_alone_in_a_batch_and_on_any_thread_count(ggml, qtype):
    K = 512 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 352   # 32-element: a group of 8 blocks and 3
    w = blocks(qtype, 67, K, seed=3)
    x = torch.randn(37, K, generator=torch.Generator().manual_seed(4))
    batched = ggml.matmul(x, w, qtype)
    assert torch.equal(torch.cat([ggml.matmul(x[i:i + 1].clone(), w, qtype) for i in range(37)]), batched)
    for cut in (6, 10):   # batches of 6 and 31, of 10 (one AMX tile, padded) and 27 (a pair and one)
        assert torch.equal(torch.cat([ggml.matmul(x[:cut].clone(), w, qtype),
                                      ggml.matmul(x[cut:].clone(), w, qtype)]), batched), cut
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert torch.equal(ggml.matmul(x, w, qtype), batched), f"{n} threads"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_formats_give_bitwise_the_same_y_on_every_build(build_of, qtype):
    """A K format's integer sums per block are exact and folded into float32 in one order on
    every path: plain C++, AVX2, the 512-bit tiles (natively, where the CPU has AVX-512 VNNI:
    batches of 5-9 rows) and AMX (natively, where the CPU has it: batches of 10 rows and more; 40
    rows here, in 3 tiles (a pair and one alone), and 45 weight rows, in 3 panels) agree bit for
    bit."""
    w = blocks(qtype, 45, 768, seed=11)
    x = torch.randn(40, 768, generator=torch.Generator().manual_seed(12))
    want = build_of("x86-64").matmul(x, w, qtype)
    for name in BUILDS:
        for rows in (40, 9, 8, 5):
            assert torch.equal(build_of(name).matmul(x[:rows], w, qtype), want[:rows]), (name, rows)


@pytest.mark.parametrize("qtype", [t for t in TYPES if t not in K_TYPES], ids=lambda t: t.name)
def test_32_element_formats_give_bitwise_the_same_y_on_the_vector_builds(build_of, qtype):
    """A 32-element format's exact block sums go into float lane b % 8 in one order on the AVX2
    tiles, the AVX-512 panels (natively, with AVX-512 VNNI and no AMX: 40 rows, 45 weight rows in
    2 panels and 13 rows left) and the AMX tiles (natively, where the CPU has it: 40 rows, a pair
    of tiles and one, and 45 weight rows in 3 panels), so the native and the haswell builds agree
    bit for bit (the plain C++ path folds in another order: within the bound, not bitwise)."""
    w = blocks(qtype, 45, 32 * 19, seed=13)
    x = torch.randn(40, 32 * 19, generator=torch.Generator().manual_seed(14))
    vector = [name for name in BUILDS if EXPECTED_PATH[name] != "scalar"]
    if len(vector) < 2:
        pytest.skip(f"one vector build here ({vector}): nothing to compare")
    want = build_of(vector[0]).matmul(x, w, qtype)
    for name in vector[1:]:
        assert torch.equal(build_of(name).matmul(x, w, qtype), want), name


B_TYPES = [t for t in TYPES if t not in K_TYPES]


@pytest.mark.parametrize("qtype", B_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("N, blocks_per_row", [(40, 19), (1000, 3), (48, 16)])
def test_32_element_formats_give_a_row_bitwise_its_own_y_in_every_batch(ggml, qtype, N, blocks_per_row):
    """Batches below and from the panels of 16 weight rows (natively, with AVX-512 VNNI and no
    AMX: from 4 rows; every tile height; N = 40: two panels and 8 rows left to the row tiles,
    N = 1000: several items of work; 19 blocks a row: lanes of 3 and 2 blocks, 3: lanes with none,
    16: two each), rows lying apart, 1-3 threads: each row of y bitwise that row alone."""
    K = 32 * blocks_per_row
    w = blocks(qtype, N, K, seed=31)
    apart = torch.zeros(N, w.shape[1] + 24, dtype=torch.uint8)
    apart[:, :w.shape[1]] = w
    x = torch.randn(41, K, generator=torch.Generator().manual_seed(32))
    alone = torch.cat([ggml.matmul(x[i:i + 1].clone(), w, qtype) for i in range(41)])
    for rows in (2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 33, 41):
        assert torch.equal(ggml.matmul(x[:rows], w, qtype), alone[:rows]), rows
    assert torch.equal(ggml.matmul(x[:17], apart[:, :w.shape[1]], qtype), alone[:17])
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            assert torch.equal(ggml.matmul(x, w, qtype), alone), n
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q4_1], ids=lambda t: t.name)
def test_a_nan_or_inf_in_a_row_spoils_that_row_only(ggml, qtype):
    """Max |x| would drop a NaN (the block's scale must not): NaN or inf in x[m] gives y[m] no
    finite value, and the other rows are bitwise what they are without it."""
    K = 512
    w = blocks(qtype, 11, K, seed=8)
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(9))
    clean = ggml.matmul(x, w, qtype)
    x[1, 300], x[2, 7] = float("nan"), float("inf")
    got = ggml.matmul(x, w, qtype)
    assert not torch.isfinite(got[1:3]).any()
    assert torch.equal(got[0], clean[0]) and torch.equal(got[3], clean[3])


def test_rows_may_lie_apart(ggml):
    w = blocks(T.Q4_K, 21, 512, seed=5)
    apart = torch.zeros(21, w.shape[1] + 40, dtype=torch.uint8)
    apart[:, :w.shape[1]] = w
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(6))
    assert torch.equal(ggml.matmul(x, apart[:, :w.shape[1]], T.Q4_K), ggml.matmul(x, w, T.Q4_K))


def test_an_empty_batch_gives_an_empty_result(ggml):
    assert ggml.matmul(torch.zeros(0, 256), blocks(T.Q4_K, 3, 256, seed=0), T.Q4_K).shape == (0, 3)


@pytest.mark.parametrize("case, message", [
    ("IQ2_XXS", r"GGML type 16 \(IQ2_XXS\) is not supported; supported: Q4_0 \(2\), Q4_1 \(3\)"),
    ("F16", r"GGML type 1 \(F16\) is not supported.*Q6_K \(14\).*IQ4_XS \(23\)"),
    ("type 99", r"GGML type 99 \(unknown\) is not supported"),
    ("row bytes", r"w rows must hold K / 256 \* 144 = 288 bytes of Q4_K blocks for K = 512 \(got 144\)"),
    ("K", r"K = 100 is not a positive multiple of Q8_0's block of 32"),
    ("strided x", r"x must be contiguous"),
    ("float64 x", r"x must be a float32 \[M, K\] CPU tensor"),
    ("int8 w", r"w must be a uint8 \[N, row_bytes\] CPU tensor of Q4_K blocks"),
])
def test_bad_input_is_refused_naming_the_type(ggml, case, message):
    x, w, qtype = torch.randn(2, 512), blocks(T.Q4_K, 4, 512, seed=0), int(T.Q4_K)
    if case in ("IQ2_XXS", "F16"):
        qtype = int(T[case])
    elif case == "type 99":
        qtype = 99
    elif case == "row bytes":
        w = w[:, :144]
    elif case == "K":
        x, w, qtype = torch.randn(2, 100), torch.zeros(4, 100, dtype=torch.uint8), int(T.Q8_0)
    elif case == "strided x":
        x = torch.randn(2, 1024)[:, ::2]
    elif case == "float64 x":
        x = x.double()
    else:
        w = w.view(torch.int8)
    with pytest.raises(RuntimeError, match=message):
        ggml.matmul(x, w, qtype)


X8_TYPES = [T.Q4_K, T.Q5_K, T.Q6_K]


def test_the_vector_builds_interleave_q4_k_q5_k_and_q6_k(ggml):
    assert ggml.interleaved_types() == ([int(t) for t in X8_TYPES] if EXPECTED_PATH[ggml.name] != "scalar" else [])


def x8_build(ggml) -> Kernels:
    if not ggml.interleaved_types():
        pytest.skip(f"the {ggml.name} build keeps no type interleaved (plain C++)")
    return ggml


@pytest.mark.parametrize("qtype", X8_TYPES, ids=lambda t: t.name)
def test_the_interleaved_layout_is_the_references(ggml, qtype):
    from localpaged.kernels import ggml_reference
    x8, name = x8_build(ggml), qtype.name
    w = blocks(qtype, 24, 768, seed=21)
    got = x8.interleave(w, qtype)
    assert torch.equal(got, ggml_reference.interleave(w, name))
    assert torch.equal(ggml_reference.deinterleave(got, name), w)
    # spot check of the spec: row 3's unit 5 of block 1 at 4 (8 * 5 + 3) in group 0's block 1
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    group = got[:8].reshape(-1)
    assert torch.equal(group[8 * size + 4 * 43: 8 * size + 4 * 44], w[3, size + 20: size + 24])


@pytest.mark.parametrize("qtype", X8_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("N, K", [(48, 1280), (40, 1280), (1000, 256)])
def test_the_interleaved_layout_gives_bitwise_the_rows_y(ggml, qtype, N, K):
    """Batch 1 (its own loop), 2-130 rows (tiles of up to 4 rows over each group; with AVX2 alone
    (the haswell build) from 5 rows (Q4_K, Q5_K) or 3 (Q6_K) each group unpacked into a panel; with AVX-512 VNNI and no
    AMX the 512-bit loops over pairs of groups, tiles of up to 4 rows, from 16 rows (Q6_K) or 128
    (Q4_K, Q5_K) over each pair unpacked into a panel, and the 8-row group left over where N / 8
    is odd: N = 40, and N = 1000 in three items of work, the last with a group left over;
    natively on AMX from 20 rows for Q6_K and 32 for Q4_K, each panel moved back to GGUF's rows):
    every tile height and every boundary between the paths, the same bits as the GGUF rows, on
    every thread count."""
    x8 = x8_build(ggml)
    w = blocks(qtype, N, K, seed=22)
    wx = x8.interleave(w, qtype)
    x = torch.randn(130, K, generator=torch.Generator().manual_seed(23))
    want = x8.matmul(x, w, qtype)
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 15, 16, 17, 31, 40, 127, 128, 130):
        assert torch.equal(x8.matmul_x8(x[:rows], wx, qtype), want[:rows]), rows
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            for rows in (1, 9, 17, 130):
                assert torch.equal(x8.matmul_x8(x[:rows], wx, qtype), want[:rows]), (n, rows)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", X8_TYPES, ids=lambda t: t.name)
def test_the_interleaved_layout_gives_bitwise_the_same_y_on_every_build(build_of, qtype):
    """Every build's paths over the x8 layout (x8 tiles, pairs, panels of either width) give the
    plain C++ path's y on GGUF's rows, bit for bit, below and from the panels."""
    w = blocks(qtype, 48, 768, seed=41)
    x = torch.randn(33, 768, generator=torch.Generator().manual_seed(42))
    want = build_of("x86-64").matmul(x, w, qtype)
    for name in [n for n in BUILDS if EXPECTED_PATH[n] != "scalar"]:
        x8 = build_of(name)
        wx = x8.interleave(w, qtype)
        for rows in (33, 16, 5, 4, 3, 2):
            assert torch.equal(x8.matmul_x8(x[:rows], wx, qtype), want[:rows]), (name, rows)


def test_the_interleaved_layout_refuses_what_it_cannot_take(ggml):
    x8 = x8_build(ggml)
    with pytest.raises(RuntimeError, match=r"N a multiple of 8"):
        x8.interleave(blocks(T.Q4_K, 12, 256, seed=0), T.Q4_K)
    with pytest.raises(RuntimeError, match=r"GGML type 8 has no interleaved kernel"):
        x8.interleave(blocks(T.Q8_0, 8, 256, seed=0), T.Q8_0)
    with pytest.raises(RuntimeError, match=r"Q8_0 \[8, 272\] is not in a layout this build interleaves"):
        x8.matmul_x8(torch.randn(1, 256), blocks(T.Q8_0, 8, 256, seed=0), T.Q8_0)


def test_the_decode_prefetch_distances_change_no_bit(cpu_ext, tmp_path):
    """LOCALPAGED_X8_PREFETCH (read once per process) moves only where the x8 loops of 1-2 rows
    ask for lines ahead: y of the native build is the same bits under other distances."""
    if not cpu_ext.ggml_interleaved_types():
        pytest.skip("this build interleaves no format (no x8 loops)")
    import os
    import subprocess
    import sys
    flag = cpu_ext.ggml_interleaved_flag()
    cases = []
    for qtype in (T.Q4_K, T.Q6_K):
        w = blocks(qtype, 64, 1024, seed=51)
        wx = torch.empty_like(w)
        cpu_ext.ggml_interleave(w, int(qtype), wx)
        x = torch.randn(2, 1024, generator=torch.Generator().manual_seed(52))
        ys = [cpu_ext.ggml_matmul(x[:rows], wx, int(qtype) | flag) for rows in (1, 2)]
        cases.append((int(qtype) | flag, wx, x, ys))
    torch.save([(t, wx, x) for t, wx, x, _ in cases], tmp_path / "cases.pt")
    child = ("import sys, torch\n"
             "from localpaged.kernels import cpu_extension\n"
             "cpu_extension.BUILD.wait()\n"
             "m = cpu_extension.BUILD.module\n"
             "cases = torch.load(sys.argv[1])\n"
             "torch.save([[m.ggml_matmul(x[:r], wx, t) for r in (1, 2)] for t, wx, x in cases], sys.argv[2])\n")
    for distances in ("0,64", "2048,16384"):
        out = tmp_path / f"y-{distances}.pt"
        subprocess.run([sys.executable, "-c", child, str(tmp_path / "cases.pt"), str(out)], check=True,
                       env={**os.environ, "LOCALPAGED_X8_PREFETCH": distances}, timeout=600)
        for (_, _, _, want), got in zip(cases, torch.load(out)):
            for w_, g_ in zip(want, got):
                assert torch.equal(w_, g_), distances
