"""Quantized Linear / Embedding modules and the CPU kernel choice by shape.

The modules hold a `PackedWeight` as a plain attribute (not a parameter or buffer), so the
loader's `to_empty()` / `.to(dtype)` on the rest of the model never touch or copy it.

Kernel choice (see bench/quant_linear.py for the measurement behind it):
- CUDA: `localpaged.kernels.triton_quant_matmul.quant_matmul(x, pw)` when that module exists,
  else dequantize-then-matmul.
- CPU int8: rows are computed as `bf16(x) @ q^T * scales`, rounded to bf16, then cast to x.dtype.
  M <= CPU_INT8_PACKED_MAX_M runs torch's `aten._weight_int8pack_mm`; larger M runs the same
  formula as one float32 matmul on the int8 values (the packed op is slow for large M). Both
  paths give each row the same value up to float32 summation order, so batching does not change a
  row beyond what fp32 `linear` already allows (a float32 result on the large-M path broke that
  invariance in tests/test_quant_engine.py). Scales are kept bf16-representable (layout.py), so
  the bf16 cast of the scales is exact: SmolLM2 perplexity int8 31.69 vs float32 31.67.
- CPU int4 and grouped int8 (GGUF Q4_*/Q8_0 kept exact): dequantize (the float32 reference)
  then `F.linear` in x.dtype, for every M: the output equals the float32 model with the same
  dequantized weights (what transformers computes from the GGUF). This saves memory, not time:
  one-conversation decode measured 0.13x float32 on SmolLM2 (loaded 2-core machine), so
  "auto" does not choose it on CPU (loader.load). torch's packed int4 CPU op
  (`_weight_int4pack_mm_for_cpu`, torch's own tiled nibble layout) measured 15-30x slower than
  float32 `linear` at M=1 on SmolLM2's shapes (K = 576, 1536) here; TODO: a fast CPU int4 path.
"""

from __future__ import annotations

import importlib
import logging

import torch
import torch.nn.functional as F
from torch import nn

from localpaged.quant.layout import PackedWeight

logger = logging.getLogger(__name__)

CPU_INT8_PACKED_MAX_M = 8
_TRITON_MODULE = "localpaged.kernels.triton_quant_matmul"
_triton_quant_matmul = None   # resolved once, lazily: the module may not exist yet


def _cuda_kernel():
    global _triton_quant_matmul
    if _triton_quant_matmul is None:
        try:
            _triton_quant_matmul = importlib.import_module(_TRITON_MODULE).quant_matmul
        except (ImportError, AttributeError):
            logger.warning("%s not available: quantized matmul dequantizes on the GPU", _TRITON_MODULE)
            _triton_quant_matmul = False
    return _triton_quant_matmul or None


def quant_linear(x: torch.Tensor, pw: PackedWeight) -> torch.Tensor:
    """x [M, K] -> [M, N] in x.dtype."""
    if x.is_cuda:
        kernel = _cuda_kernel()
        if kernel is not None and (pw.bits == 4 or pw.per_channel):
            return kernel(x, pw)
        return F.linear(x, pw.dequantize(x.dtype))
    if pw.bits == 8 and pw.per_channel:
        xb = x.to(torch.bfloat16)
        scales = pw.scales.to(torch.bfloat16)
        if x.shape[0] <= CPU_INT8_PACKED_MAX_M:
            y = torch.ops.aten._weight_int8pack_mm(xb, pw.qweight, scales)
        else:
            y = (F.linear(xb.float(), pw.qweight.float()) * scales.float()).to(torch.bfloat16)
        return y.to(x.dtype)
    return F.linear(x, pw.dequantize(x.dtype))


class QuantLinear(nn.Module):
    def __init__(self, packed: PackedWeight, bias: nn.Parameter | None) -> None:
        super().__init__()
        self.packed = packed                      # plain attribute: never re-materialized
        self.in_features, self.out_features = packed.shape[1], packed.shape[0]
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = quant_linear(x.reshape(-1, shape[-1]), self.packed)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.packed.format}"


class QuantEmbedding(nn.Module):
    """Rows gathered from the packed table, then dequantized: only the looked-up rows."""

    def __init__(self, packed: PackedWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.packed = packed
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        return self.packed.dequantize(self.dtype, rows=flat).view(*ids.shape, self.packed.shape[1])


LINEAR_NAMES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def install(model: nn.Module, packed: dict[str, PackedWeight], dtype: torch.dtype) -> None:
    """Swap the model's Linear/Embedding modules for quantized ones, by weight name.

    Called on the meta-device model before its other weights are materialized; a bias (Qwen2)
    stays a parameter and is loaded with the rest.
    """
    for name, pw in packed.items():
        module_name = name.removesuffix(".weight")
        parent_name, _, attr = module_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, attr)
        if isinstance(old, nn.Embedding):
            new = QuantEmbedding(pw, dtype)
        else:
            if (old.out_features, old.in_features) != pw.shape:
                raise ValueError(f"{name}: packed shape {pw.shape} does not match the model's "
                                 f"{(old.out_features, old.in_features)}")
            new = QuantLinear(pw, old.bias)
        setattr(parent, attr, new)
    embed = model.model.embed_tokens
    if model.config.tie_word_embeddings and isinstance(embed, QuantEmbedding):
        model.lm_head = QuantLinear(embed.packed, None)     # tied: one packed table, read twice


def weights_summary(model: nn.Module) -> tuple[int, str]:
    """(bytes of all weights, e.g. "int4 g32 · 92 MB"): packed tables counted once when shared."""
    seen: set[int] = set()
    total, formats = 0, {}
    for module in model.modules():
        pw = getattr(module, "packed", None)
        if isinstance(pw, PackedWeight) and id(pw.qweight) not in seen:
            seen.add(id(pw.qweight))
            total += pw.nbytes
            formats[pw.format] = formats.get(pw.format, 0) + pw.shape[0] * pw.shape[1]
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    if formats:
        main = max(formats, key=formats.get)
    else:
        main = str(next(model.parameters()).dtype).removeprefix("torch.")
    mb = total / 1e6
    return total, f"{main} · {mb:.0f} MB" if mb >= 10 else f"{main} · {mb:.2g} MB"
