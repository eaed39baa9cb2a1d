"""Shared pytest set-up.

Without CUDA, Triton kernels can only run under the interpreter, and whether a kernel is
interpreted is fixed when triton and the kernel modules are imported (``@triton.jit`` reads
TRITON_INTERPRET then). So set it here, before any test module imports triton. An explicit
setting wins.
"""

import os

import torch  # importing torch does not import triton

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    """A session-wide folder of tiny random HF models (see tests/tiny_models.py)."""
    return str(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def tiny_llama(tiny_root):
    import tiny_models
    return tiny_models.build("llama-gqa", tiny_root)
