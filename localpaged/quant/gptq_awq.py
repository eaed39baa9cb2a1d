"""4-bit GPTQ / AWQ safetensors checkpoints (Hub layout) read onto the canonical int4 PackedWeight.

A checkpoint is recognized by `quantization_config` in config.json. Each quantized linear layer
`<prefix>` holds int32 tensors packing eight 4-bit values (value j in bits 4j..4j+3):
- GPTQ: `qweight` [K / 8, N] packed along K (value j of qweight[i, n] is q[8i + j, n]);
  `qzeros` [K / G, N / 8] packed along N (value j of qzeros[g, c] is z[g, 8c + j]);
  `scales` fp16 [K / G, N]; `g_idx` [K] (group of input k; k // G unless desc_act reordered it).
  checkpoint_format / format "gptq" (v1, what optimum, AutoGPTQ and gptqmodel's export write)
  stores z - 1 in qzeros (the historic off-by-one: their kernels add 1 back, after masking, so a
  zero of 0 that wrapped to 15 reads as 16, as here); "gptq_v2" stores z.
- AWQ (GEMM version, as AutoAWQ and gptqmodel write it): `qweight` [K, N / 8] packed along N,
  `qzeros` [K / G, N / 8], `scales` fp16 [K / G, N]; value i of a packed word is column
  8c + AWQ_ORDER[i] (the interleave of AutoAWQ's GEMM kernel).
Both dequantize as w[n, k] = (q[k, n] - z[g, n]) * s[g, n] with g = k // G, which is the canonical
w = q * scale + min with scale = s, min = -z * s. Scales and mins are kept in float32: s is fp16
and z <= 16 an integer, so z * s and (q - z) * s are exact in float32 and the canonical dequantized
weights equal the checkpoint's bit for bit.
"""

from __future__ import annotations

import glob
import logging
import os

import torch
from tqdm.auto import tqdm

from localpaged.models.llama import FUSED
from localpaged.quant.convert import quantizable, quantize_tensor
from localpaged.quant.layout import INT4_GROUP_SIZES, PackedWeight, pack_int4, quantize_int8

logger = logging.getLogger(__name__)

METHODS = ("gptq", "awq")
GPTQ_FORMATS = ("gptq", "gptq_v2")
AWQ_VERSIONS = ("gemm",)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PACKED_PARTS = ("qweight", "qzeros", "scales", "g_idx")
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def check_config(qc: dict) -> dict:
    """The settings we read, from `quantization_config`; a ValueError naming the supported set."""
    method = str(qc.get("quant_method", "")).lower()
    if method not in METHODS:
        raise ValueError(f"quantization_config.quant_method {method!r} is not supported; supported "
                         f"pre-quantized checkpoints: {', '.join(METHODS)} (4-bit)")
    bits = qc.get("bits", qc.get("w_bit"))
    group_size = qc.get("group_size", qc.get("q_group_size"))
    if bits != 4:
        raise ValueError(f"{method} checkpoint with bits={bits}: only bits=4 is supported")
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"{method} checkpoint with group_size={group_size}: supported group sizes "
                         f"are {', '.join(map(str, INT4_GROUP_SIZES))}")
    if method == "gptq":
        fmt = str(qc.get("checkpoint_format", qc.get("format", "gptq"))).lower()
        if fmt not in GPTQ_FORMATS:
            raise ValueError(f"gptq checkpoint_format {fmt!r} is not supported; supported: "
                             f"{', '.join(GPTQ_FORMATS)}")
        if qc.get("dynamic"):
            raise ValueError("gptq checkpoints with per-module 'dynamic' settings are not supported")
        return {"method": method, "group_size": group_size, "zero_offset": 1 if fmt == "gptq" else 0}
    version = str(qc.get("version", qc.get("format", "gemm"))).lower()
    if version not in AWQ_VERSIONS:
        raise ValueError(f"awq version {version!r} is not supported; supported: {', '.join(AWQ_VERSIONS)}")
    if qc.get("zero_point", True) is not True:
        raise ValueError("awq checkpoints with zero_point=false are not supported; supported: zero_point=true")
    return {"method": method, "group_size": group_size, "zero_offset": 0}


def unpack_int32(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] -> values 0..15 [R, C, 8], value j from bits 4j..4j+3."""
    return (packed.to(torch.int32).unsqueeze(-1) >> _SHIFTS) & 15


def gptq_to_packed(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                   g_idx: torch.Tensor | None, group_size: int, zero_offset: int, name: str) -> PackedWeight:
    K8, N = qweight.shape
    K = K8 * 8
    if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(K) // group_size):
        raise ValueError(f"{name}: GPTQ with desc_act (act-order, a reordered g_idx) is not supported; "
                         f"supported: desc_act=false")
    _check_shapes(name, K, N, qzeros, scales, group_size)
    q = unpack_int32(qweight).permute(0, 2, 1).reshape(K, N)           # [K, N]
    z = unpack_int32(qzeros).reshape(K // group_size, N) + zero_offset  # [K/G, N]
    return _canonical(q, z, scales, group_size)


def awq_to_packed(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  group_size: int, name: str) -> PackedWeight:
    K, N8 = qweight.shape
    _check_shapes(name, K, N8 * 8, qzeros, scales, group_size)
    inverse = torch.argsort(torch.tensor(AWQ_ORDER))   # column 8c + j sits at value inverse[j]
    q = unpack_int32(qweight)[..., inverse].reshape(K, N8 * 8)
    z = unpack_int32(qzeros)[..., inverse].reshape(K // group_size, N8 * 8)
    return _canonical(q, z, scales, group_size)


def _check_shapes(name: str, K: int, N: int, qzeros: torch.Tensor, scales: torch.Tensor,
                  group_size: int) -> None:
    """Whole groups only: the canonical layout has no partial last group."""
    if K % group_size or tuple(qzeros.shape) != (K // group_size, N // 8) or \
            tuple(scales.shape) != (K // group_size, N):
        raise ValueError(f"{name}: packed tensors of a {N}x{K} weight do not match group_size "
                         f"{group_size} (qzeros {tuple(qzeros.shape)}, scales {tuple(scales.shape)}); "
                         f"supported: in_features divisible by the group size")


def _canonical(q: torch.Tensor, z: torch.Tensor, scales: torch.Tensor, group_size: int) -> PackedWeight:
    """q [K, N], z [K/G, N] integers, scales [K/G, N] -> w = q * scale + min with min = -z * scale."""
    K, N = q.shape
    s = scales.float().t().contiguous()                 # [N, K/G]
    mins = -z.t().float() * s                            # exact: |z| <= 16, s fp16
    return PackedWeight(4, group_size, pack_int4(q.t().to(torch.uint8).contiguous()), s,
                        mins.contiguous(), (N, K))


def read_prequantized(path: str, qc: dict, quantization: str,
                      dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, PackedWeight]]:
    """(float tensors, packed weights) by our unfused names. "auto"/"int4" keep the checkpoint's
    int4 exactly; "none" dequantizes to `dtype` (computed in float32); "int8" requantizes."""
    settings = check_config(qc)
    from safetensors import safe_open
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    floats: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for file in tqdm(files, desc="loading weights", unit="shard", disable=len(files) < 2):
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                prefix, _, kind = key.rpartition(".")
                if kind in PACKED_PARTS:
                    parts.setdefault(prefix, {})[kind] = f.get_tensor(key)
                else:
                    floats[key] = f.get_tensor(key)
    packed: dict[str, PackedWeight] = {}
    layers = sorted(parts)
    for prefix in layers:                   # each layer's parts may span shards: converted once whole
        p = parts.pop(prefix)
        missing = [k for k in ("qweight", "qzeros", "scales") if k not in p]
        if missing:
            raise ValueError(f"{prefix}: {settings['method']} layer without {', '.join(missing)}")
        if settings["method"] == "gptq":
            pw = gptq_to_packed(p["qweight"], p["qzeros"], p["scales"], p.get("g_idx"),
                                settings["group_size"], settings["zero_offset"], prefix)
        else:
            pw = awq_to_packed(p["qweight"], p["qzeros"], p["scales"], settings["group_size"], prefix)
        name = f"{prefix}.weight"
        if quantization == "none":
            floats[name] = pw.dequantize(dtype)
        else:
            packed[name] = quantize_int8(pw.dequantize()) if quantization == "int8" else pw
    logger.info("%s checkpoint: %d int4 g%d layers, %s", settings["method"], len(layers),
                settings["group_size"], "dequantized" if quantization == "none" else f"loaded as {quantization}")
    if quantization in ("int8", "int4"):    # float layers the checkpoint left (embeddings, lm_head)
        for name in [n for n, w in floats.items() if quantizable(n) and w.dim() == 2]:
            packed[name] = quantize_tensor(name, floats.pop(name), quantization)
    return floats, packed


def drop_unused_zero_biases(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Some GPTQ exporters write an all-zero `bias` for every quantized layer, bias-free ones too:
    dropped where the model has no such bias (a non-zero one still fails loading, as it should)."""
    names = set(model.state_dict())
    return {k: v for k, v in state.items()
            if not (k.endswith(".bias") and _fused_name(k) not in names and not v.any())}


def _fused_name(name: str) -> str:
    """q/k/v and gate/up parameter names as the model (fused) has them."""
    for fused, parts in FUSED.items():
        for part in parts:
            if f".{part}." in name:
                return name.replace(part, fused)
    return name
