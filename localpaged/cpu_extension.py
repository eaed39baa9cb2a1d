"""The compiled CPU extension: the `cpu` attention backend's decode kernel and the batch-1 loop.

One torch.utils.cpp_extension build of kernels/cpu_decode.cpp (paged decode attention),
models/batch1_cpu.cpp (the decoder layers of a batch-1 decode step) and cpu_extension.cpp (the
Python bindings). g++ and ninja compile it once per machine and source version (~30 s), then it
is cached under ~/.cache/torch_extensions, named after the CPU it was built for (-march=native).

It builds in a background thread, started by the first engine on CPU: until it is ready, or when
it cannot be built (one warning line), decode attention runs the torch reference and steps decode
in Python, so the first reply never waits for it. Before first use its kernel is checked once
against the torch reference on a small input; a mismatch is one warning line and no extension.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
import time

import torch

from localpaged.kernels import reference

logger = logging.getLogger(__name__)

_HERE = os.path.dirname(os.path.abspath(__file__))
_KERNELS = os.path.dirname(reference.__file__)
_MODELS = os.path.join(_HERE, "models")
SOURCES = [os.path.join(_KERNELS, "cpu_decode.cpp"), os.path.join(_MODELS, "batch1_cpu.cpp"),
           os.path.join(_HERE, "cpu_extension.cpp")]
CHECK_TOLERANCE = 1e-5       # the kernel against the torch reference, float32


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
            logger.info("CPU extension ready (%.1f s): decode attention and batch-1 decode in C++",
                        time.monotonic() - start)
        else:
            logger.warning("CPU extension %s: decode attention by the torch reference, decoding "
                           "in Python", failure)
        self.done.set()


def _compile():
    from torch.utils.cpp_extension import load
    return load(f"localpaged_cpu_{_cpu_tag()}", SOURCES, extra_include_paths=[_KERNELS, _MODELS],
                extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                verbose=False)


@torch.inference_mode()
def self_check(module) -> str | None:
    """None when the compiled decode kernel matches the torch reference on a small paged batch
    (grouped heads, blocks out of order, lengths across a chunk boundary), else what differs."""
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(12, 16, 2, 64, generator=gen) for _ in range(2))
    q = torch.randn(2, 6, 64, generator=gen)
    tables = torch.tensor([[7, 2, 9, 0, 5, 11], [3, 1, 4, 6, 8, 10]], dtype=torch.int32)
    lens = torch.tensor([70, 93], dtype=torch.int32)
    got = module.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125)
    want = reference.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125)
    err = (got - want).abs().max().item()
    if not err <= CHECK_TOLERANCE:                  # also catches NaN
        return f"failed its check: decode attention differs from the torch reference by {err:.3g}"
    return None


BUILD = Build()
