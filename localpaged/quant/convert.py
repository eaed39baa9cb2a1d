"""Quantize a float checkpoint tensor by tensor, and fuse packed q/k/v and gate/up weights.

Fusion stacks the parts into one weight where they share a layout (a PackedWeight of one width
and group size, or a GgmlWeight of one block format); parts kept differently (a Q4_K_M file's
Q4_K q/k beside a Q6_K v) become a PartsWeight: one matmul each, nothing requantized.

Explicit "int8"/"int4" on safetensors: each linear weight is read alone (safe_open), quantized and
dropped, so the float model never exists whole. Embeddings and lm_head become int8 (see gguf.py).
"""

from __future__ import annotations

import glob
import os

import torch

from localpaged.models.llama import FUSED
from localpaged.quant.ggml import GgmlWeight, PartsWeight
from localpaged.quant.layout import PackedWeight, quantize_int4, quantize_int8

QUANTIZED_SUFFIXES = tuple(f"{p}.weight" for parts in FUSED.values() for p in parts) + \
    ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def quantizable(name: str) -> bool:
    return name.endswith(QUANTIZED_SUFFIXES) or name in ("model.embed_tokens.weight", "lm_head.weight")


def quantize_tensor(name: str, w: torch.Tensor, quantization: str, group_size: int = 32) -> PackedWeight:
    if quantization == "int8" or not name.endswith(QUANTIZED_SUFFIXES):
        return quantize_int8(w)
    return quantize_int4(w, group_size)


def read_safetensors(path: str, quantization: str) -> tuple[dict[str, torch.Tensor], dict[str, PackedWeight]]:
    from safetensors import safe_open
    floats: dict[str, torch.Tensor] = {}
    packed: dict[str, PackedWeight] = {}
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                w = f.get_tensor(name)
                if quantizable(name) and w.dim() == 2:
                    packed[name] = quantize_tensor(name, w, quantization)
                else:
                    floats[name] = w
    return floats, packed


def fuse_biases(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Float q/k/v (or gate/up) biases of layers whose weights are packed: stacked the same way."""
    out = dict(state)
    prefixes = {k.rsplit(".", 3)[0] for k in state if k.startswith("model.layers.") and k.endswith(".bias")}
    for prefix in prefixes:
        for fused, parts in FUSED.items():
            names = [f"{prefix}.{part}.bias" for part in parts]
            if all(n in out for n in names):
                out[f"{prefix}.{fused}.bias"] = torch.cat([out.pop(n) for n in names])
    return out


def stack(parts: list) -> PackedWeight | GgmlWeight | PartsWeight:
    """Weights stacked along N: one weight where the parts share a layout, else a PartsWeight."""
    if len({p.stack_key() for p in parts}) == 1:
        return parts[0].stack(parts)
    return PartsWeight(parts)


def fuse_packed(packed: dict) -> dict:
    """q/k/v -> qkv_proj and gate/up -> gate_up_proj, as models.llama.fuse_state_dict does."""
    out = dict(packed)
    prefixes = {k.rsplit(".", 3)[0] for k in packed if k.startswith("model.layers.")}
    for prefix in prefixes:
        for fused, parts in FUSED.items():
            names = [f"{prefix}.{part}.weight" for part in parts]
            if all(n in out for n in names):
                out[f"{prefix}.{fused}.weight"] = stack([out.pop(n) for n in names])
    return out
