"""A 1B-class benchmark model that behaves like a real one: the bundled SmolLM2-135M's function
at 1.5B parameters' bytes, quantized to Q4_K_M by llama.cpp's own quantizer.

The random-weight file of real_model.py reads and computes what a real 1.5B model does, but its
replies copy nothing, so speculative decoding's code edit and summary cannot be measured on it.
This file computes SmolLM2's function (up to the two quantizations) inside larger matrices, so it
costs what a 1.5B model costs per token and copies what SmolLM2 copies:
- hidden 576 -> 2048, zeros in the new dimensions of every vector; RMSNorm's weights times
  sqrt(576 / 2048) and its epsilon times 576 / 2048, so each norm gives on the first 576
  dimensions SmolLM2's output (the mean square over 2048 dimensions is 576 / 2048 of it);
- heads of 64: 9 query heads in 32 slots, 3 KV heads in 8 (4 query slots per KV head: SmolLM2's
  query heads 3j..3j+2 sit in slots 4j..4j+2, the fourth slot's output columns are zero);
- FFN 1536 -> 5632 (the new gate/up rows and down columns zero), 30 layers, the vocabulary of
  49,152, the tied embedding written out again as an untied lm_head (as the 3B-8B models have).
1.55B parameters, ~0.95 GB as Q4_K_M. Written once to the bench cache (minutes):

    PYTHONPATH=<llama-cpp-python's site> python bench/inflated_model.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from real_model import (CACHE, LCP_MISSING, add_tokenizer, bundled_tokenizer,  # noqa: E402
                        import_llama_cpp, quantize)

NAME = "smollm2-135m-inflated-1.5b"
SRC = dict(hidden=576, heads=9, kv_heads=3, ffn=1536)
DST = dict(hidden=2048, heads=32, kv_heads=8, ffn=5632, head_dim=64)


def path(cache: Path = CACHE) -> Path:
    return cache / f"{NAME}.Q4_K_M.gguf"


def _source() -> tuple[dict[str, np.ndarray], dict]:
    import gguf
    from localpaged.runner.model_source import bundled_gguf_path
    reader = gguf.GGUFReader(bundled_gguf_path())
    weights = {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
               .reshape(list(reversed([int(d) for d in t.shape]))) for t in reader.tensors}
    meta = {k: reader.fields[k].contents() for k in reader.fields if k.startswith("llama.")}
    return weights, meta


def _slots(q: np.ndarray, rows_per_head: int, heads_in: int, slot) -> np.ndarray:
    """Rows (or, transposed, columns) of heads_in heads placed at head slots slot(i)."""
    out = np.zeros((DST["heads"] if heads_in == SRC["heads"] else DST["kv_heads"],
                    rows_per_head) + q.shape[1:], dtype=np.float32)
    for i in range(heads_in):
        out[slot(i)] = q[i * rows_per_head:(i + 1) * rows_per_head]
    return out.reshape((-1,) + q.shape[1:])


def _pad(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """a in the corner of zeros of `shape`; matrices as float16 (the F16 file's type)."""
    out = np.zeros(shape, dtype=np.float32 if len(shape) == 1 else np.float16)
    out[tuple(slice(0, n) for n in a.shape)] = a
    return out


def inflate(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    h, hd = DST["hidden"], DST["head_dim"]
    group = DST["heads"] // DST["kv_heads"]
    q_slot = lambda i: (i // 3) * group + i % 3            # SmolLM2's query head i -> slot
    norm = np.float32(np.sqrt(SRC["hidden"] / h))
    out: dict[str, np.ndarray] = {}
    for name, w in weights.items():
        if name.endswith("norm.weight"):
            out[name] = _pad(w * norm, (h,))
        elif name == "token_embd.weight":
            out[name] = _pad(w, (w.shape[0], h))
            out["output.weight"] = out[name].copy()
        elif name.endswith("attn_q.weight"):
            out[name] = _pad(_slots(w, hd, SRC["heads"], q_slot), (DST["heads"] * hd, h))
        elif name.endswith(("attn_k.weight", "attn_v.weight")):
            out[name] = _pad(_slots(w, hd, SRC["kv_heads"], lambda i: i), (DST["kv_heads"] * hd, h))
        elif name.endswith("attn_output.weight"):
            cols = _slots(np.ascontiguousarray(w.T), hd, SRC["heads"], q_slot)   # input columns
            out[name] = _pad(np.ascontiguousarray(cols.T), (h, DST["heads"] * hd))
        elif name.endswith(("ffn_gate.weight", "ffn_up.weight")):
            out[name] = _pad(w, (DST["ffn"], h))
        elif name.endswith("ffn_down.weight"):
            out[name] = _pad(w, (h, DST["ffn"]))
        else:
            raise ValueError(f"unexpected tensor {name}")
    return out


def write_f16(dst: Path) -> None:
    import gguf
    weights, meta = _source()
    tensors = inflate(weights)
    tok = bundled_tokenizer()
    w = gguf.GGUFWriter(str(dst), "llama")
    w.add_name(NAME)
    w.add_description("SmolLM2-135M-Instruct's function zero-padded to 1.5B parameters' shapes: "
                      "a localpaged benchmark file (bench/inflated_model.py)")
    w.add_context_length(int(meta["llama.context_length"]))
    w.add_embedding_length(DST["hidden"])
    w.add_block_count(int(meta["llama.block_count"]))
    w.add_feed_forward_length(DST["ffn"])
    w.add_head_count(DST["heads"])
    w.add_head_count_kv(DST["kv_heads"])
    w.add_rope_dimension_count(DST["head_dim"])
    w.add_rope_freq_base(float(meta["llama.rope.freq_base"]))
    eps = float(meta["llama.attention.layer_norm_rms_epsilon"]) * SRC["hidden"] / DST["hidden"]
    w.add_layer_norm_rms_eps(eps)
    w.add_vocab_size(int(meta["llama.vocab_size"]))
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    add_tokenizer(w, tok, list(tok["ggml.tokens"]), list(tok["ggml.token_type"]))
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()


def ensure(cache: Path = CACHE) -> Path:
    """The Q4_K_M file, made once (F16 by gguf's writer, then llama.cpp's quantizer)."""
    dst = path(cache)
    if dst.is_file():
        return dst
    llama_cpp = import_llama_cpp()
    if llama_cpp is None:
        sys.exit(f"cannot make {dst.name}: Q4_K_M comes from llama.cpp's quantizer. {LCP_MISSING}")
    cache.mkdir(parents=True, exist_ok=True)
    f16 = cache / f"{NAME}.F16.gguf"
    start = time.perf_counter()
    if not f16.is_file():
        write_f16(f16.with_suffix(".part"))
        f16.with_suffix(".part").rename(f16)
    quantize(llama_cpp, f16, dst.with_suffix(".part"), "LLAMA_FTYPE_MOSTLY_Q4_K_M")
    dst.with_suffix(".part").rename(dst)
    print(f"made {dst} ({dst.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - start:.0f} s")
    return dst


if __name__ == "__main__":
    print(ensure())
