"""Shared pytest set-up.

Without CUDA, Triton kernels can only run under the interpreter, and whether a kernel is
interpreted is fixed when its module is imported (``@triton.jit`` reads TRITON_INTERPRET then).
So set it here, before any test module imports the kernels. An explicit setting wins.
"""

import os

import torch  # importing torch does not import triton

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
