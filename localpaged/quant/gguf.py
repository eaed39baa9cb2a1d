"""GGUF weights read tensor by tensor, kept compressed where our packed layout holds them exactly.

Per tensor (never the whole model in float32); what "auto" keeps (then quant/linear.py's
install() puts each weight in the form its device's kernels read, quant/cpu.py on CPU):
- Q4_0 / Q4_1 -> int4 g32, bit-exact (Q4_1 is w = q * d + m; Q4_0 is mins = -8 * d);
- Q8_0 -> int8 g32 (float16 scales), bit-exact; an explicit "int8" makes it per channel;
- Q5_*, Q6_K, Q8_K -> int8 and Q2_K..Q4_K -> int4 g32 (gguf's numpy dequantizer, then
  requantized: a 5/6-bit grid does not fit 4 bits without a visible loss, see the tests);
- F32 / F16 / BF16 -> float tensors as is (quantized only when the user asks for int8/int4).
Explicit "int8"/"int4" requantize every linear weight to that width; embeddings and lm_head are
then int8 (int4 costs the most quality there). llama.cpp stores Llama q/k rows permuted for its
rotary layout: undone here by a row permutation, exact on packed rows too.
"""

from __future__ import annotations

import logging
import mmap
import re

import numpy as np
import torch
from tqdm.auto import tqdm

from localpaged.quant.layout import (
    PackedWeight,
    cat_rows,
    pack_int4,
    permute_rows,
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
FLOAT_TYPES = ("F32", "F16", "BF16")
EXACT_INT4 = ("Q4_0", "Q4_1")
TO_INT8 = ("Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_K")
TO_INT4 = ("Q2_K", "Q3_K", "Q4_K")
SUPPORTED = FLOAT_TYPES + EXACT_INT4 + TO_INT8 + TO_INT4
SKIPPED = ("rope_freqs",)      # recomputed from the config
CHUNK_WEIGHTS = 1 << 22        # weights dequantized at once (16 MB in float32): bounds the peak
TRIM_BYTES = 1 << 20           # after a tensor this large in float32, hand freed heap pages back


def hf_name(gguf_name: str) -> str | None:
    base, _, kind = gguf_name.rpartition(".")
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in NAME_MAP:
        return f"model.layers.{m.group(1)}.{NAME_MAP[m.group(2)]}.{kind}"
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


def read_gguf(path: str, config, quantization: str) -> tuple[dict[str, torch.Tensor], dict[str, PackedWeight]]:
    """(float tensors, packed weights) by our (unfused) parameter names."""
    import gguf
    reader = gguf.GGUFReader(path)
    unsupported = sorted({t.tensor_type.name for t in reader.tensors} - set(SUPPORTED))
    if unsupported:
        raise ValueError(f"unsupported GGUF tensor type(s) {', '.join(unsupported)} in {path}; "
                         f"supported: {', '.join(SUPPORTED)}")
    tensors = reader.tensors
    reader.fields.clear()      # the metadata (~100 MB of Python objects for a 49k vocabulary): unused
    permute = config.model_type in ("llama", "mistral")
    floats: dict[str, torch.Tensor] = {}
    packed: dict[str, PackedWeight] = {}
    for t in tqdm(tensors, desc="loading GGUF", unit="tensor", leave=False):
        name = hf_name(t.name)
        if name is None:
            if not t.name.startswith(SKIPPED):
                logger.warning("GGUF tensor %s has no counterpart in the model: skipped", t.name)
            continue
        kind = t.tensor_type.name
        is_matrix = len(t.shape) == 2 and name.endswith(".weight")
        bits = target_bits(quantization, kind, "embed_tokens" in name or name.startswith("lm_head")) \
            if is_matrix else None
        value = _convert(t, kind, bits, exact=quantization == "auto")
        if permute and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            index = _unpermute_index(int(t.shape[-1]), heads)
            value = permute_rows(value, index) if isinstance(value, PackedWeight) else value.index_select(0, index)
        (packed if isinstance(value, PackedWeight) else floats)[name] = value
        _drop_file_pages(reader.data, t.data_offset, t.n_bytes)   # read once, copied: unmap
        if int(t.n_elements) * 4 >= TRIM_BYTES:       # its float32 temporaries, if any
            trim_heap()        # this tensor's freed temporaries back to the OS, not fragmenting
    return floats, packed


def _convert(t, kind: str, bits: int | None, exact: bool):
    """One GGUF tensor in the form it is kept in. Matrices that must be dequantized go through
    float32 CHUNK_WEIGHTS at a time, row by row, straight into the final buffer (float) or packed
    rows (int8/int4 scales are per row or per group along K, so a chunk packs exactly as the whole
    would): the peak is one chunk, never the whole tensor in float32 plus numpy's temporaries."""
    if bits == 4 and kind in EXACT_INT4:
        return _q4_exact(np.asarray(t.data), kind)
    if bits == 8 and kind == "Q8_0" and exact:
        return _q8_exact(np.asarray(t.data))
    shape = [int(d) for d in reversed(t.shape)]
    if len(shape) != 2:                                 # norms, biases: small, bits is None
        return _dequantize(t.data, t.tensor_type).reshape(shape)
    N, K = shape
    # odd K with int4: one chunk, so quantize_int4's error names the whole weight's shape
    step = N if bits == 4 and K % 32 else max(1, CHUNK_WEIGHTS // K)
    out = torch.empty(N, K) if bits is None else None
    parts: list[PackedWeight] = []
    for i in range(0, N, step):
        w = _dequantize(t.data[i:i + step], t.tensor_type).reshape(-1, K)
        if bits is None:
            out[i:i + w.shape[0]] = w
        else:
            parts.append(quantize_int8(w) if bits == 8 else quantize_int4(w, 32))
        del w
    if bits is None:
        return out
    return parts[0] if len(parts) == 1 else cat_rows(parts)


def _dequantize(data, tensor_type) -> torch.Tensor:
    import gguf
    return torch.from_numpy(np.array(gguf.quants.dequantize(data, tensor_type), dtype=np.float32))


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


def _drop_file_pages(data, offset: int, length: int) -> None:
    """Drop the file's mapped pages of one tensor from our RSS once it has been converted (every
    form we keep is a copy). Read-only file pages: a later touch would read them again, so this
    only changes accounting and the peak, never a value. No-op where madvise is unavailable."""
    mm = getattr(data, "_mmap", None)                # numpy.memmap's mapping of the whole file
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = offset - offset % mmap.PAGESIZE
    mm.madvise(mmap.MADV_DONTNEED, start, offset + length - start)


def _unpermute_index(rows: int, heads: int) -> torch.Tensor:
    """Row order undoing llama.cpp's (n_head, 2, dim) -> (n_head, dim, 2) q/k permutation."""
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)
