"""Tiny Llama-family GGUF model files, written with gguf-py's GGUFWriter, that llama.cpp, our
loader and transformers (``from_pretrained(dir, gguf_file=name)``) all load.

Shapes are multiples of 256 so that the K-quants apply: hidden 256, intermediate 512, 2 layers,
4 attention heads of 64, 2 KV heads, vocab 512, 1024 positions, an untied ``output.weight``.
Weights are normal(0, 0.08) from a seeded torch.Generator; norm weights 1 + normal(0, 0.05).

Two architectures: ``llama`` (q/k rows stored permuted for llama.cpp's rotary layout, as its
converter's ``LlamaModel.permute`` does; transformers un-permutes them) and ``qwen2`` (q/k/v
biases; no permutation, as llama.cpp's Qwen2 converter).

The tokenizer lives in the metadata: ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE): the 256
byte tokens (id = byte value, spelled in GPT-2's byte-to-unicode alphabet), the tokens of MERGES,
the special tokens of SPECIALS (CONTROL type), then ``[PAD<id>]`` tokens (UNUSED) up to 512.

    write_tiny_gguf(path, arch="llama", tensor_type="F32", seed=0) -> str
    hf_state_dict(arch="llama", seed=0) -> {transformers name: float32 tensor}  (the intended
        weights, before any permutation or quantization)
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB, POSITIONS = 256, 512, 2, 4, 2, 512, 1024
HEAD_DIM = HIDDEN // HEADS
RMS_EPS = 1e-5
ROPE_THETA = {"llama": 10000.0, "qwen2": 1000000.0}
ARCHS = tuple(ROPE_THETA)
STD = 0.08

# byte-level BPE merges, in priority order (each result becomes a token)
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġt", "he"),
    ("Ġ", "s"), ("r", "e"), ("a", "t"), ("e", "n"), ("Ġ", "w"), ("o", "r"), ("i", "s"),
    ("Ġ", "c"), ("e", "s"), ("a", "n"), ("Ġ", "o"), ("Ġ", "b"), ("e", "d"), ("Ġ", "f"),
    ("in", "g"), ("Ġ", "p"), ("o", "u"), ("Ġa", "n"), ("Ġan", "d"), ("Ġ", "m"), ("l", "l"),
    ("Ġo", "f"), ("Ġ", "i"), ("Ġ", "h"), ("Ġt", "o"),
]
SPECIALS = {"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": "<|pad|>",
            "im_start": "<|im_start|>", "im_end": "<|im_end|>"}
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
# what gguf.quants.quantize can write (besides the float types)
TENSOR_TYPES = ("F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
FILE_TYPES = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
              "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
              "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0, "Q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
              "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


def _byte_spelling() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable character standing for each byte 0..255."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    spelled, extra = {}, 0
    for b in range(256):
        if b in keep:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return [spelled[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], dict[str, int]]:
    """(tokens, token types, special token ids by role) of the tiny tokenizer."""
    tokens = _byte_spelling()
    types = [int(gguf.TokenType.NORMAL)] * 256
    for left, right in MERGES:
        assert left in tokens and right in tokens and left + right not in tokens, (left, right)
        tokens.append(left + right)
        types.append(int(gguf.TokenType.NORMAL))
    ids = {}
    for role, text in SPECIALS.items():
        ids[role] = len(tokens)
        tokens.append(text)
        types.append(int(gguf.TokenType.CONTROL))
    while len(tokens) < VOCAB:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(int(gguf.TokenType.UNUSED))
    return tokens, types, ids


def hf_state_dict(arch: str = "llama", seed: int = 0) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' names, float32, as transformers should end up
    with them (q/k unpermuted)."""
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r} is not supported; supported: {ARCHS}")
    g = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=g) * STD

    def norm():
        return 1.0 + torch.randn(HIDDEN, generator=g) * 0.05

    kv = KV_HEADS * HEAD_DIM
    sd = {"model.embed_tokens.weight": normal(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm()
        sd[p + "self_attn.q_proj.weight"] = normal(HIDDEN, HIDDEN)
        sd[p + "self_attn.k_proj.weight"] = normal(kv, HIDDEN)
        sd[p + "self_attn.v_proj.weight"] = normal(kv, HIDDEN)
        if arch == "qwen2":
            sd[p + "self_attn.q_proj.bias"] = normal(HIDDEN)
            sd[p + "self_attn.k_proj.bias"] = normal(kv)
            sd[p + "self_attn.v_proj.bias"] = normal(kv)
        sd[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HIDDEN)
        sd[p + "post_attention_layernorm.weight"] = norm()
        sd[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        sd[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        sd[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
    sd["model.norm.weight"] = norm()
    sd["lm_head.weight"] = normal(VOCAB, HIDDEN)
    return sd


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf LlamaModel.permute: q/k rows of each head reordered from
    HF's halves layout (rotate_half) to llama.cpp's interleaved pairs."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_tensors(arch: str = "llama", seed: int = 0) -> dict[str, np.ndarray]:
    """The float32 tensors under GGUF names, as llama.cpp's converter would store them."""
    out = {}
    for name, t in hf_state_dict(arch, seed).items():
        w = t.numpy()
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        elif name == "lm_head.weight":
            out["output.weight"] = w
        else:
            i, rest = name[len("model.layers."):].split(".", 1)
            if arch == "llama" and rest.startswith("self_attn.q_proj"):
                w = permute(w, HEADS)
            elif arch == "llama" and rest.startswith("self_attn.k_proj"):
                w = permute(w, KV_HEADS)
            out[f"blk.{i}.{_GGUF_NAMES[rest]}"] = w
    return out


def write_tiny_gguf(path: str, arch: str = "llama", tensor_type: str = "F32",
                    seed: int = 0) -> str:
    """Write the tiny model to `path` (a file path, or an existing folder to write
    ``tiny-<arch>-<tensor_type>.gguf`` into) and return the file's path. `tensor_type` (one of
    TENSOR_TYPES) applies to every 2-D weight; "MIXED" gives the 2-D weights the quantized
    TENSOR_TYPES in turn (every format in one file, and formats mixed inside each layer); norms
    and biases stay F32."""
    if tensor_type == "MIXED":
        return _write(path, arch, seed, "MIXED", list(TENSOR_TYPES[2:]))
    if tensor_type not in TENSOR_TYPES:
        raise ValueError(f"tensor_type {tensor_type!r} is not supported; supported: "
                         f"{TENSOR_TYPES}")
    return _write(path, arch, seed, tensor_type, [tensor_type])


def _write(path: str, arch: str, seed: int, label: str, cycle: list[str]) -> str:
    tensors = gguf_tensors(arch, seed)                    # validates arch
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, f"tiny-{arch}-{label}.gguf")
    tensor_type = cycle[0]

    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(POSITIONS)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_freq_base(ROPE_THETA[arch])
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(int(FILE_TYPES[tensor_type]))
    if tensor_type not in ("F32", "F16"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tokens, types, ids = vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_bos_token_id(ids["bos"])
    writer.add_eos_token_id(ids["eos"])
    writer.add_pad_token_id(ids["pad"])
    writer.add_add_bos_token(arch == "llama")
    writer.add_chat_template(CHAT_TEMPLATE)

    matrices = 0
    for name, w in tensors.items():
        qtype = Q[cycle[matrices % len(cycle)]] if w.ndim == 2 else Q.F32
        matrices += w.ndim == 2
        if w.ndim == 1 or qtype == Q.F32:
            writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))
        elif qtype == Q.F16:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def committed(name: str) -> str:
    """A file made by llama.cpp's quantizer (tests/data/make_ggml_models.py)."""
    from helpers import DATA
    path = DATA / "ggml" / f"tiny-{name if name.startswith('qwen2') else 'llama-' + name}.gguf"
    assert path.exists(), f"{path} is missing: run tests/data/make_ggml_models.py"
    return str(path)
