"""Weights in llama.cpp's own block formats (Q4_K, Q6_K, Q8_0, ...), and weights made of parts.

`GgmlWeight` keeps a GGUF matrix as the file stores it: `data` uint8 [N, row_bytes], row n
holding output row n's K / block_elems blocks (layouts: kernels/ggml_reference.py). On CPU it is
a view of the mapped file (quant/gguf_file.py): loading copies nothing, and the weights in memory
are the file's own pages; except the formats the extension keeps interleaved (Q4_K, Q5_K, Q6_K
with N a multiple of 8): those are copied once at load into the x8 layout (the same bytes, each
group of 8 rows side by side: ggml_reference.interleave) and the file's pages dropped; its
batch-1 loop reads that layout as one linear stream, 4 codes of each of 8 rows in every 32-byte
load (docs/benchmarks.md, 'Real models', has the decode figures, from bench/real_model.py). On CPU
the extension multiplies it (kernels/cpu_ggml.cpp: activations quantized to int8 per block,
integer dot products, the way llama.cpp does); on CUDA a Triton kernel reads the same bytes
(kernels/triton_ggml.py: dequantized in registers); where the extension cannot be built, or a
kernel is missing, `REFERENCE` (the torch reference, bit-exact with gguf-py: the rows
dequantized, then F.linear). Which serves a weight is fixed when it is made, never switched while
a model serves, and each weight names it (`kernels()`, the engine's stats).

`PartsWeight` is a fused projection (q/k/v, gate/up) whose parts are kept in different formats
(a Q4_K_M file keeps attn_v in Q6_K beside Q4_K q and k): one matmul per part, outputs side by
side, so every part stays in its own format and nothing is requantized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import logging

import torch
import torch.nn.functional as F

from localpaged.kernels import cpu_extension, ggml_reference
from localpaged.quant.memory import mapped_bytes
from localpaged.quant.weight import Batch1Code, Batch1Layout, QuantWeight, WeightDefaults

logger = logging.getLogger(__name__)

FALLBACK_ROWS = 4096            # rows dequantized at once by the fallback matmul (bounds memory)
X8_FLAG = 1 << 8                # added to the type number of a weight in the x8 layout (cpu_ggml.cpp)


@dataclass(frozen=True)
class NativeKernel:
    """A matmul over GGML blocks, (x [M, K], data, type id) -> [M, N] in x's dtype, the formats
    it takes and the device type it runs on; `in_extension`: it is the CPU extension's own
    `ggml_matmul`, the one the C++ decode loop calls (runner/batch1_cpu.py); `name`: what the
    engine's stats call it ("cpu extension (avx2+vnni)", "triton", "reference")."""
    kernel: Callable
    kinds: frozenset[str]
    device_type: str = "cpu"
    in_extension: bool = False
    name: str = "reference"
    x8_kinds: frozenset[str] = frozenset()     # kept interleaved (x8) where N % 8 == 0
    interleave: Callable | None = None         # (data, type id, out): out = data in the x8 layout


def _cpu_matmul(module) -> Callable:
    def matmul(x: torch.Tensor, data: torch.Tensor, type_id: int) -> torch.Tensor:
        return module.ggml_matmul(x.float().contiguous(), data, type_id).to(x.dtype)
    return matmul


def reference_matmul(x: torch.Tensor, data: torch.Tensor, type_id: int) -> torch.Tensor:
    """x [M, K] @ dequantize(data).T in x's dtype: the torch reference (kernels/ggml_reference.py,
    bit-exact with gguf-py), FALLBACK_ROWS rows of GGUF's row layout dequantized at a time (bounds
    memory), then F.linear."""
    kind = ggml_reference.format_for_type_id(type_id).name
    N = data.shape[0]
    parts = [F.linear(x, ggml_reference.dequantize(data[i:i + FALLBACK_ROWS], kind).to(x.dtype))
             for i in range(0, N, FALLBACK_ROWS)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


# Every format, on any device: what serves GGUF blocks where no compiled kernel does
REFERENCE = NativeKernel(reference_matmul, frozenset(ggml_reference.FORMATS))


def cpu_native() -> NativeKernel:
    """The kernel of a quantized GGUF file's blocks on CPU, which keeps every format as the file
    has it: the CPU extension's, its build waited for where this machine has none yet (a first
    build compiles, with a progress line: kernels/cpu_extension.py module_for_load); where it
    cannot be built, REFERENCE, with a warning saying so."""
    module = cpu_extension.BUILD.module_for_load("this GGUF file's load")
    if module is None or not hasattr(module, "ggml_supported"):
        logger.warning("the CPU extension is not available (see the line above): this GGUF file's "
                       "block formats are kept and multiplied by the plain-torch reference kernels "
                       "(each weight dequantized at every step: far slower); with g++ and ninja "
                       "installed the next load compiles the CPU kernels")
        return REFERENCE
    kinds = frozenset(k for k, f in ggml_reference.FORMATS.items() if module.ggml_supported(f.type_id))
    assert module.ggml_interleaved_flag() == X8_FLAG, "cpu_ggml.cpp and quant/ggml.py disagree"
    x8 = frozenset(ggml_reference.format_for_type_id(t).name for t in module.ggml_interleaved_types())
    return NativeKernel(_cpu_matmul(module), kinds, in_extension=True, x8_kinds=x8,
                        interleave=module.ggml_interleave, name=cpu_extension.describe(module))


@dataclass
class GgmlWeight(WeightDefaults):
    kind: str                      # a key of ggml_reference.FORMATS
    data: torch.Tensor             # uint8 [N, row_bytes]
    shape: tuple[int, int]         # logical (N, K)
    native: NativeKernel | None = None  # the kernel of data's device; None: dequantize, F.linear
    release: Callable[[], None] | None = field(default=None, repr=False)  # drops the file pages
    interleaved: bool = False      # data in the x8 layout of the CPU kernel (to_x8)

    def __post_init__(self) -> None:
        N, K = self.shape
        want = (N, ggml_reference.row_bytes(self.kind, K))
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want:
            raise ValueError(f"{self.kind} weight {N}x{K}: expected uint8 {want}, got "
                             f"{self.data.dtype} {tuple(self.data.shape)}")

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    @property
    def kernel(self) -> Callable | None:
        return self.native.kernel if self.native is not None else None

    @property
    def type_id(self) -> int:
        """GGML's number for the format (the kernel's argument), with X8_FLAG when interleaved."""
        return ggml_reference.FORMATS[self.kind].type_id | (X8_FLAG if self.interleaved else 0)

    @property
    def format(self) -> str:
        return self.kind

    @property
    def on_extension(self) -> bool:
        """Multiplied by the CPU extension's own kernel: the one the C++ batch-1 loop calls."""
        return self.native is not None and self.native.in_extension

    def batch1_layout(self) -> Batch1Layout | None:
        return ([Batch1Code.GGML, self.type_id], [self.data]) if self.on_extension else None

    def kernels(self) -> set[str]:
        return {self.native.name if self.native is not None else REFERENCE.name}

    def to(self, device: torch.device) -> GgmlWeight:
        """On `device`, keeping the kernel when it was made for that device type."""
        device = torch.device(device)
        if self.data.device == device:
            return self
        native = self.native if self.native and self.native.device_type == device.type else None
        return GgmlWeight(self.kind, self.rows().to(device), self.shape, native)

    def rows(self) -> torch.Tensor:
        """data as GGUF's rows (a copy where it is interleaved)."""
        return ggml_reference.deinterleave(self.data, self.kind) if self.interleaved else self.data

    def load_layout(self) -> GgmlWeight:
        """The layout a linear's weight is kept in from load on: x8 where the CPU kernel has it."""
        return self.to_x8()

    def stack_key(self) -> tuple:
        """Weights with equal keys stack into one (cat_ggml): one format, K and layout."""
        return ("ggml", self.kind, self.shape[1], self.interleaved)

    @staticmethod
    def stack(parts: list[GgmlWeight]) -> GgmlWeight:
        return cat_ggml(parts)

    def to_x8(self) -> GgmlWeight:
        """In the x8 layout, where the CPU kernel has one for this format and N % 8 == 0 (a copy:
        the file's pages are dropped); else self."""
        native = self.native
        if self.interleaved or native is None or native.interleave is None or \
                self.kind not in native.x8_kinds or self.shape[0] % ggml_reference.X8_ROWS or \
                self.data.device.type != "cpu":
            return self
        data = mapped_bytes(self.data.numel()).view(self.data.shape)
        native.interleave(self.data.contiguous(), self.type_id, data)   # type_id: no flag yet
        if self.release is not None:
            self.release()
        return GgmlWeight(self.kind, data, self.shape, native, interleaved=True)

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
        data = self.rows()
        data = data if rows is None else data.index_select(0, rows.to(data.device))
        return ggml_reference.dequantize(data, self.kind).to(dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x.dtype."""
        if self.native is not None and self.native.device_type == x.device.type == self.data.device.type:
            return self.native.kernel(x, self.data, self.type_id)
        return reference_matmul(x, self.rows(), ggml_reference.FORMATS[self.kind].type_id)

    def permute_rows(self, index: torch.Tensor) -> GgmlWeight:
        """Output rows reordered (llama.cpp's q/k rotary order undone): whole rows move, exact.
        A copy: the file's pages of this tensor are dropped from memory."""
        out = GgmlWeight(self.kind, self.rows().index_select(0, index), self.shape, self.native)
        if self.release is not None:
            self.release()
        return out


@dataclass
class PartsWeight:
    """Weights stacked along N, each kept in its own form: y = [x @ p.T for p in parts]."""
    parts: list[QuantWeight]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def format(self) -> str:
        return "+".join(p.format for p in self.parts)

    def formats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.parts:
            out[p.format] = out.get(p.format, 0) + p.shape[0] * p.shape[1]
        return out

    def to(self, device: torch.device) -> PartsWeight:
        return PartsWeight([p.to(device) for p in self.parts])

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p.matmul(x) for p in self.parts], dim=-1)

    def linear_form(self) -> PartsWeight:
        return PartsWeight([p.linear_form() for p in self.parts])

    def kernels(self) -> set[str]:
        return set().union(*(p.kernels() for p in self.parts))

    def embedding_form(self) -> PartsWeight:
        return self

    def batch1_layout(self) -> Batch1Layout | None:
        """Parts all GGML blocks on the extension's kernel: one code for the whole."""
        layouts = [p.batch1_layout() for p in self.parts]
        if any(lay is None or lay[0][0] != Batch1Code.GGML for lay in layouts):
            return None
        types = torch.tensor([lay[0][1] for lay in layouts], dtype=torch.int64)
        return [Batch1Code.GGML_PARTS, len(self.parts)], [types, *(lay[1][0] for lay in layouts)]

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
        w = torch.cat([p.dequantize(dtype) for p in self.parts])
        return w if rows is None else w.index_select(0, rows)



def cat_ggml(parts: list[GgmlWeight]) -> GgmlWeight:
    """One weight of parts that share a format, K and layout: rows stacked (a copy; the parts'
    file pages are dropped from memory once copied). Interleaved parts stack as they are: each
    part's N is a multiple of 8, so its groups stay whole."""
    first = parts[0]
    data = mapped_bytes(sum(p.data.numel() for p in parts)).view(-1, first.data.shape[1])
    torch.cat([p.data for p in parts], out=data)
    for p in parts:
        if p.release is not None:
            p.release()
    return GgmlWeight(first.kind, data, (data.shape[0], first.shape[1]), first.native,
                      interleaved=first.interleaved)
