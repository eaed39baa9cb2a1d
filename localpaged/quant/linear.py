"""Quantized Linear / Embedding modules and the CPU kernel choice by shape.

The modules hold a weight (quant/weight.py: QuantWeight) as a plain attribute (not a parameter or buffer), so the
loader's `to_empty()` / `.to(dtype)` on the rest of the model never touch or copy it.

Kernel choice:
- CUDA: `localpaged.kernels.triton_quant_matmul.quant_matmul` (int4, per-channel int8), else
  dequantize-then-matmul.
- CPU: the weights are first put in the form the CPU kernels read (quant/cpu.py, with the
  measurements behind it): int4 runs the CPU extension's kernel (quant/cpu_tiles.py) or
  `aten._weight_int4pack_mm_for_cpu`, int8
  `aten._weight_int8pack_mm`, both with bf16 activations, for every batch size (one kernel per
  weight, so a row's value does not depend on the batch). What those ops cannot take (int4 with N
  not divisible by 16) dequantizes, then `F.linear`.
- GGML block formats (quant/ggml.py: GgmlWeight): the CPU extension's integer kernel, else
  dequantize-then-matmul; a PartsWeight (parts in different forms) is one call per part.
- Embeddings gather rows of the canonical PackedWeight (or GgmlWeight) and dequantize only those.
Each weight form makes that choice itself, through the contract of quant/weight.py: the modules
here call `matmul`, `dequantize`, `linear_form` and `embedding_form` and ask no form its kind.
"""

from __future__ import annotations

import torch
from torch import nn

from localpaged.quant.weight import QuantWeight


class QuantLinear(nn.Module):
    def __init__(self, packed: QuantWeight, bias: nn.Parameter | None) -> None:
        super().__init__()
        self.packed = packed                      # plain attribute: never re-materialized
        self.in_features, self.out_features = packed.shape[1], packed.shape[0]
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])   # the engine's [T, hidden]
        y = self.packed.matmul(flat)
        if self.bias is not None:
            y = y + self.bias
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.packed.format}"


class QuantEmbedding(nn.Module):
    """Rows gathered from the packed table, then dequantized: only the looked-up rows."""

    def __init__(self, packed: QuantWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.packed = packed
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        return self.packed.dequantize(self.dtype, rows=flat).view(*ids.shape, self.packed.shape[1])


LINEAR_NAMES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def install(model: nn.Module, packed: dict[str, QuantWeight], dtype: torch.dtype) -> None:
    """Swap the model's Linear/Embedding modules for quantized ones, by weight name.

    Called on the meta-device model before its other weights are materialized; a bias (Qwen2)
    stays a parameter and is loaded with the rest.
    """
    for name, pw in packed.items():
        module_name = name.removesuffix(".weight")
        parent_name, _, attr = module_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, attr)
        embedding = isinstance(old, nn.Embedding)
        want = (old.num_embeddings, old.embedding_dim) if embedding else (old.out_features, old.in_features)
        if want != tuple(pw.shape):
            raise ValueError(f"{name} ({pw.format}): shape {'x'.join(map(str, pw.shape))} does "
                             f"not match the model's {want[0]}x{want[1]}")
        if embedding:
            new = QuantEmbedding(pw.embedding_form(), dtype)
        else:
            new = QuantLinear(pw.linear_form(), old.bias)
        setattr(parent, attr, new)
    embed = model.model.embed_tokens
    if model.config.tie_word_embeddings and isinstance(embed, QuantEmbedding):
        # tied: one packed table read twice, unless the matmul needs its own form (CPU int4)
        model.lm_head = QuantLinear(embed.packed.linear_form(), None)


def _weights(model: nn.Module) -> tuple[int, dict[str, int], dict[str, int]]:
    """(bytes of all weights, weights per packed format, weights per float dtype): packed tables
    counted once when shared, float tensors once."""
    seen: set[int] = set()
    total, formats, floats = 0, {}, {}
    for module in model.modules():
        pw = getattr(module, "packed", None)
        if isinstance(pw, QuantWeight) and id(pw) not in seen:
            seen.add(id(pw))
            total += pw.nbytes
            for name, count in pw.formats().items():
                formats[name] = formats.get(name, 0) + count
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
            if t.is_floating_point():
                name = str(t.dtype).removeprefix("torch.")
                floats[name] = floats.get(name, 0) + t.numel()
    return total, formats, floats


def weights_summary(model: nn.Module) -> tuple[int, str]:
    """(bytes of all weights, e.g. "int4 g32 · 92 MB"): packed tables counted once when shared."""
    total, formats, _ = _weights(model)
    if formats:
        main = max(formats, key=formats.get)
    else:
        main = str(next(model.parameters()).dtype).removeprefix("torch.")
    mb = total / 1e6
    return total, f"{main} · {mb:.0f} MB" if mb >= 10 else f"{main} · {mb:.2g} MB"


def weight_formats(model: nn.Module) -> dict[str, int]:
    """Weights (elements) per format the model holds them in, most first: packed formats
    ("Q4_K", "int4 g32") and float dtypes ("float32": norms, biases, float matrices)."""
    _, formats, floats = _weights(model)
    return dict(sorted({**floats, **formats}.items(), key=lambda kv: -kv[1]))


def kernels_summary(model: nn.Module) -> str:
    """What multiplies the model's linears (QuantWeight.kernels; float matrices: "torch"), the
    kernel serving the most weights first, others after " + ": e.g.
    "cpu extension (avx2+vnni+avx512)", "reference", "triton + torch"."""
    weights: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, QuantLinear):
            names, count = module.packed.kernels(), module.in_features * module.out_features
        elif isinstance(module, nn.Linear):
            names, count = {"torch"}, module.weight.numel()
        else:
            continue
        for name in names:
            weights[name] = weights.get(name, 0) + count
    return " + ".join(sorted(weights, key=lambda name: (-weights[name], name)))
