"""The compiled CPU extension: decode attention, int4 and GGUF-block matmuls, RMSNorm, the batch-1
decode loop.

One torch.utils.cpp_extension build of kernels/cpu_decode.cpp (paged decode attention, the `cpu`
attention backend's), kernels/cpu_int4.cpp (int4 weight-only matmul; layout in cpu_int4_layout.py),
kernels/cpu_ggml.cpp with cpu_ggml_common.h and its fragments cpu_ggml_*.inc (matmul over GGUF
quantized blocks kept as the file's bytes: Q4_0 .. Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS;
`ggml_matmul(x, w, type_id)`),
kernels/cpu_norm.cpp (RMSNorm, models/llama.py), kernels/batch1_cpu.cpp (the decoder layers of a
batch-1 decode step), kernels/cpu_read.cpp (a memory read, bench/machine.py's bandwidth measure)
and cpu_extension.cpp (the Python bindings). g++ and ninja compile it once
per machine and source version (the .cpp files and a digest of the .h and .inc files), then it
is cached under ~/.cache/torch_extensions, named after the CPU it was built for (-march=native;
LOCALPAGED_CPU_MARCH=<target>, e.g. haswell, builds for that target instead, cached apart: how the
benches measure the AVX2 path on a CPU with AVX-512).
scripts/setup.sh builds it ahead of the app; docs/benchmarks.md ('Start-up') has the build
times. Only cpu_extension.cpp includes torch/extension.h (pybind11 and all of torch's C++ API:
most of that file's compile time); the kernels include ATen's Tensor and the ops they call.

It builds in a background thread, started by the first model load or engine on CPU: until it is
ready, or when it cannot be built (one warning line), decode attention runs the torch reference
and steps decode in Python, so the first reply never waits for it. The int4 layout and the
RMSNorm kernel are chosen when a model loads: the extension's where it is already built (cached:
a load of a few seconds is waited for), else torch's for that model. A quantized GGUF file on
CPU waits for the build whatever it takes (`module_for_load`, with a progress line): its block
formats are kept as the file has them either way, multiplied by the extension's kernel, or by the
plain-torch reference where the extension cannot be built (quant/ggml.py: cpu_native). Before first use its
kernels are checked once against their references on small inputs; a mismatch is one warning
line and no extension.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import re
import threading
import time

import torch
from tqdm.auto import tqdm

from localpaged.kernels import ggml_reference, kv_quant, reference
from localpaged.kernels.cpu_int4_layout import pack

logger = logging.getLogger(__name__)

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(_HERE, f) for f in ("cpu_decode.cpp", "cpu_int4.cpp", "cpu_ggml.cpp",
                                             "cpu_norm.cpp", "cpu_mask.cpp", "batch1_cpu.cpp",
                                             "cpu_read.cpp", "cpu_extension.cpp")]
STALE_LOCK_S = 30 * 60   # a build lock older than this was left by a build that died
CACHED_LOAD_S = 5.0          # a cached build loads within this; past it, a compile is under way
CHECK_TOLERANCE = 1e-5       # decode attention against the torch reference (int4: x100)


def _cpu_tag() -> str:
    """A short name for this CPU's instruction sets: a build for one CPU is never loaded on another."""
    flags = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            flags += next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags += platform.processor()
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


class Build:
    """The extension, built at most once per process (every engine shares it).

    `module` is None until the build and its check have succeeded; then it stays set."""

    def __init__(self) -> None:
        self.module = None
        self.done = threading.Event()
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                threading.Thread(target=self._run, name="cpu-extension-build", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the build (started if it was not); whether the extension is in use."""
        self.start()
        self.done.wait(timeout)
        return self.module is not None

    def module_if_cached(self, timeout: float = 300.0):
        """The module, waiting for the build only where this machine has built it before (a load
        from the cache, seconds, or a rebuild after an update); None at once on a first build."""
        self.start()
        if not self.done.is_set() and _built_before():
            logger.info("loading the CPU extension (rebuilt once after an update)")
            self.done.wait(timeout)
        return self.module

    def module_for_load(self, what: str):
        """The module, waiting for the build however long it takes: a first build on this
        machine compiles the kernels (minutes on a small machine), one log line and a tqdm line
        of the time spent meanwhile; None where it cannot be built. `what` names the load that
        waits, for the log line."""
        self.start()
        if not self.done.wait(CACHED_LOAD_S):            # not a load from the cache: a compile
            logger.info("compiling the CPU kernels once for this machine (g++ -march=native; "
                        "later loads use the cached build): %s waits for them", what)
            start = time.monotonic()
            with tqdm(desc="compiling the CPU kernels (once)", bar_format="{desc}: {elapsed}") as bar:
                while not self.done.wait(1.0):
                    bar.refresh()
            if self.module is not None:
                logger.info("CPU kernels compiled in %.0f s (cached for later loads)",
                            time.monotonic() - start)
        return self.module

    def _run(self) -> None:
        start = time.monotonic()
        try:
            module = _compile()
            failure = self_check(module)
        except Exception as exc:                     # no compiler, no ninja, a build error
            text = str(exc).strip()
            failure = f"not built ({text.splitlines()[-1] if text else type(exc).__name__})"
        if failure is None:
            self.module = module
            logger.info("CPU extension ready (%.1f s): decode attention, int4 and GGUF-block "
                        "matmuls, RMSNorm and batch-1 decode in C++", time.monotonic() - start)
        else:
            logger.warning("CPU extension %s: torch's own ops and the plain-torch references "
                           "serve the model instead, decoding in Python", failure)
        self.done.set()


def describe(module) -> str:
    """The extension's kernels as the engine's stats name them: its instruction-set path, e.g.
    "cpu extension (avx2+vnni+avx512)"."""
    return f"cpu extension ({module.ggml_kernel_path()})"


def _march() -> str:
    """The -march the extension is built for: native, or LOCALPAGED_CPU_MARCH."""
    march = os.environ.get("LOCALPAGED_CPU_MARCH", "native")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", march):
        raise ValueError(f"LOCALPAGED_CPU_MARCH={march!r} is not a -march target name (e.g. haswell)")
    return march


def _name() -> str:
    march = _march()
    suffix = "" if march == "native" else "_" + re.sub(r"[^a-z0-9]", "_", march)
    return f"localpaged_cpu_{_cpu_tag()}{suffix}"


def _built_before() -> bool:
    """Whether torch.utils.cpp_extension's cache holds a build of this extension for this CPU
    (its folder: TORCH_EXTENSIONS_DIR, else the default root's per-Python, per-CUDA subfolder)."""
    from torch.utils.cpp_extension import _get_build_directory
    folder = _get_build_directory(_name(), verbose=False)
    return any(f.endswith(".so") for f in os.listdir(folder))


def clear_stale_lock(folder: str, max_age_s: float = STALE_LOCK_S) -> bool:
    """Remove torch's build `lock` in folder when it is older than max_age_s: a build that died
    (a killed process) leaves it, and every later build would wait on it forever. A live build
    holds it for minutes at most. Whether a lock was removed."""
    lock = os.path.join(folder, "lock")
    try:
        age = time.time() - os.path.getmtime(lock)
    except OSError:                                  # no lock: nothing to do
        return False
    if age <= max_age_s:
        return False
    logger.warning("removing the CPU extension's build lock left %.0f min ago by a build that "
                   "did not finish (%s)", age / 60, lock)
    with contextlib.suppress(FileNotFoundError):
        os.remove(lock)
    return True


def _headers_digest() -> str:
    """A digest of the kernels' headers and fragments (.h, .inc): torch rebuilds a cached
    extension only when its sources or build arguments change, so it goes into the arguments."""
    digest = hashlib.sha1()
    for name in sorted(f for f in os.listdir(_HERE) if f.endswith((".h", ".inc"))):
        with open(os.path.join(_HERE, name), "rb") as f:
            digest.update(name.encode() + f.read())
    return digest.hexdigest()[:12]


def _compile():
    from torch.utils.cpp_extension import _get_build_directory, load
    clear_stale_lock(_get_build_directory(_name(), verbose=False))
    return load(_name(), SOURCES, extra_include_paths=[_HERE],
                extra_cflags=["-O3", f"-march={_march()}", "-fopenmp", f"-DLOCALPAGED_HEADERS={_headers_digest()}"],
                extra_ldflags=["-fopenmp"], verbose=False)


@torch.inference_mode()
def self_check(module) -> str | None:
    """None when the compiled kernels match their references on small inputs, else what differs:
    decode attention (grouped heads, blocks out of order, lengths across a chunk boundary; full
    and with a sliding window; bfloat16 and int8 caches) against the torch reference; the int4 matmul against float32 math on the dequantized weights;
    RMSNorm against transformers' formula; the GGUF-block matmul (Q4_K, Q8_0) against float32
    math on gguf-py's dequantization, within the bound of its int8 rounding of x."""
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(12, 16, 2, 64, generator=gen) for _ in range(2))
    q = torch.randn(2, 6, 64, generator=gen)
    tables = torch.tensor([[7, 2, 9, 0, 5, 11], [3, 1, 4, 6, 8, 10]], dtype=torch.int32)
    lens = torch.tensor([70, 93], dtype=torch.int32)
    failures = []
    for window in (0, 40):            # full attention; a window from inside the second block
        got = module.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, window)
        want = reference.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, window)
        failures.append(_differs(f"decode attention (window {window})", got, want,
                                 CHECK_TOLERANCE))
    for dtype in (torch.bfloat16, torch.int8):   # smaller KV caches (kernels/kv_quant.py)
        k, v = kv_quant.store(k_cache, dtype), kv_quant.store(v_cache, dtype)
        got = module.paged_decode_attention(q, k, v, tables, lens, 0.125, 0)
        want = reference.paged_decode_attention(q, k, v, tables, lens, 0.125, 0)
        failures.append(_differs(f"decode attention ({dtype} cache)", got, want, CHECK_TOLERANCE))
    ints = torch.randint(0, 16, (64, 96), generator=gen)
    scales, mins = torch.rand(3, 64, generator=gen).half() / 8, -torch.rand(3, 64, generator=gen).half()
    x = torch.randn(3, 96, generator=gen)
    got = module.int4_matmul(x, pack(ints), scales, mins, 32)
    w = ints * scales.float().repeat_interleave(32, 0).t() + mins.float().repeat_interleave(32, 0).t()
    failures.append(_differs("int4 matmul", got, x.bfloat16().float() @ w.t(), 100 * CHECK_TOLERANCE))
    weight = torch.randn(96, generator=gen)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight
    failures.append(_differs("RMSNorm", module.rms_norm(x, weight, 1e-5), want, CHECK_TOLERANCE))
    failures += [_ggml_differs(module, type_name, K, gen) for type_name, K in (("Q4_K", 512), ("Q8_0", 96))]
    failures.append(_x8_differs(module, gen))
    return next((f for f in failures if f is not None), None)


def _x8_differs(module, gen: torch.Generator) -> str | None:
    """The interleaved layout (x8) gives bitwise the GGUF rows' y: 1 row (its batch-1 loop) and 3."""
    for type_id in module.ggml_interleaved_types():
        name = ggml_reference.format_for_type_id(type_id).name
        w = ggml_reference.random_blocks(name, 16, 512, gen)
        x8 = torch.empty_like(w)
        module.ggml_interleave(w, type_id, x8)
        x = torch.randn(3, 512, generator=gen)
        for rows in (1, 3):
            got = module.ggml_matmul(x[:rows], x8, type_id | module.ggml_interleaved_flag())
            if not torch.equal(got, module.ggml_matmul(x[:rows], w, type_id)):
                return f"failed its check: the interleaved {name} matmul differs from the rows' ({rows} rows)"
    return None


def _ggml_differs(module, type_name: str, K: int, gen: torch.Generator) -> str | None:
    """The GGUF-block matmul on random blocks of one type (sane float16 scales) against float32
    math on gguf-py's dequantization, within the bound of its int8 rounding of x: sum_k |w_k|
    times max|x| over k's block (256 elements for the K types, else 32) / 254 (cpu_ggml.cpp)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
    qtype = GGMLQuantizationType[type_name]
    elems, size = GGML_QUANT_SIZES[qtype]
    N, blocks, fields = 7, K // elems, 2 if type_name.endswith("_K") else 1   # d, dmin lead Q4_K
    w = torch.randint(0, 256, (N, blocks, size), dtype=torch.uint8, generator=gen)
    d = (torch.rand(N, blocks, fields, generator=gen) / 16 + 1e-3).half()
    w[..., :2 * fields] = d.view(torch.uint8)
    w = w.reshape(N, blocks * size)
    weights = torch.from_numpy(quants.dequantize(w.numpy(), qtype))
    x = torch.randn(3, K, generator=gen)
    err = (module.ggml_matmul(x, w, int(qtype)) - x @ weights.t()).abs()
    group = 256 if elems == 256 else 32
    amax = x.abs().reshape(3, -1, group).amax(-1).repeat_interleave(group, 1)
    bound = (amax @ weights.abs().t()) / 254 + 1e-5 * (x.abs() @ weights.abs().t())
    if not bool((err <= bound).all()):              # also catches NaN
        return (f"failed its check: the {type_name} matmul differs from float32 math by "
                f"{err.max().item():.3g} (its bound: {bound.min().item():.3g} and up)")
    return None


def _differs(what: str, got: torch.Tensor, want: torch.Tensor, tolerance: float) -> str | None:
    err = (got - want).abs().max().item()
    if not err <= tolerance:                        # also catches NaN
        return f"failed its check: {what} differs from its reference by {err:.3g}"
    return None


BUILD = Build()
