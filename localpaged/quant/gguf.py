"""GGUF weights read tensor by tensor, each kept in the form that holds it exactly.

The file is mapped (quant/gguf_file.py); per tensor, never the whole model in float32:
- "auto" with a kernel for the blocks (`native`: on CPU always, the extension's or the torch
  reference, runner/loader.py _gguf_kernel; on CUDA the Triton kernel once its check passed):
  every quantized matrix stays in its own GGML block format (quant/ggml.py: GgmlWeight), a view
  of the mapped file. Nothing is converted, so a Q4_K_M file loads in the time it takes to map
  it, and its weights in memory are the file's.
- "auto" without one (a GPU whose Triton check failed): Q4_0 / Q4_1 -> int4 g32 and Q8_0 ->
  int8 g32, bit-exact; Q5_*, Q6_K, Q8_K, IQ4_* -> int8 and Q2_K..Q4_K -> int4 g32 (dequantized,
  then requantized: a 5/6-bit grid does not fit 4 bits without a visible loss, see the tests),
  with a warning naming the formats requantized;
- F32 / F16 / BF16 -> float tensors as is (quantized only when the user asks for int8/int4).
Explicit "int8"/"int4" requantize every linear weight to that width; embeddings and lm_head are
then int8 (int4 costs the most quality there). llama.cpp stores Llama q/k rows permuted for its
rotary layout: undone here by a row permutation, exact on packed rows and GGML rows alike.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from localpaged.kernels import ggml_reference
from localpaged.quant.ggml import GgmlWeight, NativeKernel
from localpaged.quant.gguf_file import GgufFile, TensorInfo
from localpaged.quant.layout import (
    PackedWeight,
    cat_rows,
    pack_int4,
    quantize_int4,
    quantize_int8,
)
from localpaged.quant.memory import trim_heap

logger = logging.getLogger(__name__)

NAME_MAP = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
TOP_MAP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Gemma 3 (llama.cpp's gemma3 tensors, as transformers' GGUF mapping names them): four norms a
# layer, its ffn_norm being the pre-feedforward one
GEMMA3_MAP = {**NAME_MAP, "ffn_norm": "pre_feedforward_layernorm",
              "post_attention_norm": "post_attention_layernorm",
              "post_ffw_norm": "post_feedforward_layernorm"}
LAYER_MAPS = {"gemma3_text": GEMMA3_MAP}
# llama.cpp's converter stores these families' (1 + w) RMSNorm weights as w + 1: transformers
# subtracts 1 again (modeling_gguf_pytorch_utils.py Gemma2TensorProcessor), and so do we
NORM_PLUS_ONE = ("gemma3_text",)
FLOAT_TYPES = ("F32", "F16", "BF16")
EXACT_INT4 = ("Q4_0", "Q4_1")
TO_INT8 = ("Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
TO_INT4 = ("Q2_K", "Q3_K", "Q4_K")
SUPPORTED = FLOAT_TYPES + tuple(ggml_reference.FORMATS)
SKIPPED = ("rope_freqs",)      # recomputed from the config
CHUNK_WEIGHTS = 1 << 22        # weights dequantized at once (16 MB in float32): bounds the peak
TRIM_BYTES = 1 << 20           # after a tensor this large in float32, hand freed heap pages back


def hf_name(gguf_name: str, model_type: str | None = None) -> str | None:
    """transformers' parameter name of a GGUF tensor (None: not a model weight); `model_type`
    (the config's) picks the family's layer names."""
    base, _, kind = gguf_name.rpartition(".")
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    layer_map = LAYER_MAPS.get(model_type, NAME_MAP)
    if m and m.group(2) in layer_map:
        return f"model.layers.{m.group(1)}.{layer_map[m.group(2)]}.{kind}"
    if base in TOP_MAP:
        return f"{TOP_MAP[base]}.{kind}"
    return None


def target_bits(quantization: str, type_name: str, is_embedding: bool) -> int | None:
    """Bit width a 2-D weight is kept at (None: float)."""
    if quantization == "none":
        return None
    if quantization in ("int8", "int4"):
        return 8 if (quantization == "int8" or is_embedding) else 4
    if type_name in FLOAT_TYPES:                       # auto: a float GGUF loads as is
        return None
    return 8 if type_name in TO_INT8 else 4


def read_gguf(path: str, config, quantization: str, native: NativeKernel | None = None,
              on_tensor: Callable[[int, int], None] | None = None
              ) -> tuple[dict[str, torch.Tensor], dict[str, PackedWeight | GgmlWeight]]:
    """(float tensors, packed weights) by our (unfused) parameter names. `native`: the kernel
    and block formats that stay as the file has them under "auto" (quant/ggml.py: cpu_native).
    `on_tensor(done, total)` before each tensor, with the tensors done so far (the
    loader's progress)."""
    file = GgufFile(path)
    _check_types(file, path)
    permute = config.model_type in ("llama", "mistral")
    norm_minus_one = config.model_type in NORM_PLUS_ONE
    keep = native.kinds if native is not None and quantization == "auto" else frozenset()
    floats: dict[str, torch.Tensor] = {}
    packed: dict[str, PackedWeight | GgmlWeight] = {}
    requantized: dict[str, str] = {}      # under "auto", a block format no kernel keeps -> its form
    for i, t in enumerate(tqdm(file.tensors, desc="loading GGUF", unit="tensor", leave=False)):
        if on_tensor is not None:
            on_tensor(i, len(file.tensors))
        name = hf_name(t.name, config.model_type)
        if name is None:
            if not t.name.startswith(SKIPPED):
                logger.warning("GGUF tensor %s has no counterpart in the model: skipped", t.name)
            continue
        is_matrix = len(t.shape) == 2 and name.endswith(".weight")
        if is_matrix and t.kind in keep:
            value = GgmlWeight(t.kind, torch.from_numpy(file.array(t)), t.shape, native,
                               release=functools.partial(file.drop_pages, t))
        else:
            bits = target_bits(quantization, t.kind, "embed_tokens" in name or name.startswith("lm_head")) \
                if is_matrix else None
            value = _convert(file.array(t), t, bits, exact=quantization == "auto")
            if quantization == "auto" and bits is not None and t.kind not in FLOAT_TYPES:
                requantized[t.kind] = value.format
            file.drop_pages(t)            # read once, copied: unmap
            if t.shape and int(np.prod(t.shape)) * 4 >= TRIM_BYTES:   # its float32 temporaries
                trim_heap()      # this tensor's freed temporaries back to the OS, not fragmenting
        if permute and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            value = _unpermute(value, heads)
        if not isinstance(value, torch.Tensor) and "embed_tokens" not in name:
            value = value.load_layout()   # e.g. the CPU kernel's batch-1 layout, where it has one
        if norm_minus_one and name.endswith("norm.weight"):
            value = value - 1.0
        (floats if isinstance(value, torch.Tensor) else packed)[name] = value
    if requantized:
        logger.warning("no kernel keeps these GGUF formats here: %s",
                       ", ".join(f"{k} converted to {v}" for k, v in sorted(requantized.items())))
    return floats, packed


def _check_types(file: GgufFile, path: str) -> None:
    """Every tensor's type is one we read, or a clear error naming a tensor of each type."""
    bad: dict[str, str] = {}
    for t in file.tensors:
        if t.kind not in SUPPORTED:
            bad.setdefault(t.kind, t.name)
    if bad:
        which = ", ".join(f"{kind} (tensor {name})" for kind, name in sorted(bad.items()))
        raise ValueError(f"unsupported GGUF tensor type(s) {which} in {path}; "
                         f"supported: {', '.join(SUPPORTED)}")


def _unpermute(value, heads: int):
    index = _unpermute_index(int(value.shape[0]), heads)
    return value.index_select(0, index) if isinstance(value, torch.Tensor) else value.permute_rows(index)


def _convert(data: np.ndarray, t: TensorInfo, bits: int | None, exact: bool):
    """One GGUF tensor in the form it is kept in (data: its bytes, as GgufFile.array gives them).
    Matrices that must be dequantized go through float32 CHUNK_WEIGHTS at a time, row by row,
    straight into the final buffer (float) or packed rows (int8/int4 scales are per row or per
    group along K, so a chunk packs exactly as the whole would): the peak is one chunk, never the
    whole tensor in float32."""
    kind = t.kind
    if bits == 4 and kind in EXACT_INT4:
        return _q4_exact(data, kind)
    if bits == 8 and kind == "Q8_0" and exact:
        return _q8_exact(data)
    if len(t.shape) != 2:                                 # norms, biases: small, bits is None
        return _dequantize(data.reshape(1, -1), kind).reshape(t.shape)
    N, K = t.shape
    # odd K with int4: one chunk, so quantize_int4's error names the whole weight's shape
    step = N if bits == 4 and K % 32 else max(1, CHUNK_WEIGHTS // K)
    out = torch.empty(N, K) if bits is None else None
    parts: list[PackedWeight] = []
    for i in range(0, N, step):
        w = _dequantize(data[i:i + step], kind).reshape(-1, K)
        if bits is None:
            out[i:i + w.shape[0]] = w
        else:
            parts.append(quantize_int8(w) if bits == 8 else quantize_int4(w, 32))
        del w
    if bits is None:
        return out
    return parts[0] if len(parts) == 1 else cat_rows(parts)


def float_tensor(file: GgufFile, t: TensorInfo) -> torch.Tensor:
    """One tensor of `file` as float32 in its (transformers-order) shape, whatever its type."""
    return _convert(file.array(t), t, None, False)


def _dequantize(rows: np.ndarray, kind: str) -> torch.Tensor:
    """uint8 rows of one tensor -> float32 [rows, K] (float types: their values as float32)."""
    raw = torch.from_numpy(np.ascontiguousarray(rows))
    if kind == "F32":
        return raw.view(torch.float32).clone()
    if kind in ("F16", "BF16"):
        return raw.view(torch.float16 if kind == "F16" else torch.bfloat16).float()
    return ggml_reference.dequantize(raw, kind)


def _q4_exact(data: np.ndarray, kind: str) -> PackedWeight:
    """Q4_0 (d, 16 bytes) / Q4_1 (d, m, 16 bytes) blocks of 32 -> canonical int4 g32, exact."""
    block = 18 if kind == "Q4_0" else 20
    N = data.shape[0]
    raw = torch.from_numpy(np.array(data)).view(N, -1, block)
    nb = raw.shape[1]
    d = raw[..., 0:2].contiguous().view(torch.float16).view(N, nb)
    if kind == "Q4_0":
        m = d * -8.0
        qs = raw[..., 2:18]
    else:
        m = raw[..., 2:4].contiguous().view(torch.float16).view(N, nb)
        qs = raw[..., 4:20]
    # GGUF: byte j holds element j (low nibble) and element j + 16 (high nibble) of its block
    q = torch.cat((qs & 15, qs >> 4), dim=-1).reshape(N, nb * 32)
    return PackedWeight(4, 32, pack_int4(q), d.contiguous(), m.contiguous(), (N, nb * 32))


def _q8_exact(data: np.ndarray) -> PackedWeight:
    """Q8_0 blocks of 32 (d float16, 32 int8) -> int8 g32 with float16 scales, exact."""
    N = data.shape[0]
    raw = torch.from_numpy(np.array(data)).view(N, -1, 34)
    nb = raw.shape[1]
    d = raw[..., 0:2].contiguous().view(torch.float16).view(N, nb)
    q = raw[..., 2:34].contiguous().view(torch.int8).reshape(N, nb * 32)
    return PackedWeight(8, 32, q, d.contiguous(), None, (N, nb * 32))


def _unpermute_index(rows: int, heads: int) -> torch.Tensor:
    """Row order undoing llama.cpp's (n_head, 2, dim) -> (n_head, dim, 2) q/k permutation."""
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)
