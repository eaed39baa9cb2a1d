"""GGUF tensors read one by one: packed weights equal gguf's own dequantization, exactly.

A tiny GGUF is written with gguf's GGUFWriter (weights quantized by gguf.quants.quantize); the
oracle is gguf.quants.dequantize plus transformers' reverse q/k permutation formula.
"""

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch

from localpaged.quant import gguf as gguf_weights
from localpaged.quant.gguf import EXACT_INT4, hf_name, read_gguf, target_bits
from localpaged.quant.layout import PackedWeight, quantize_int4, quantize_int8

Q = gguf.GGMLQuantizationType
CONFIG = SimpleNamespace(model_type="llama", num_attention_heads=4, num_key_value_heads=2)
TENSORS = {   # gguf name: (N, K, type)
    "token_embd.weight": (96, 64, Q.Q8_0),
    "blk.0.attn_q.weight": (64, 64, Q.Q4_0),
    "blk.0.attn_k.weight": (32, 64, Q.Q4_1),
    "blk.0.ffn_down.weight": (64, 128, Q.Q8_0),
    "blk.0.ffn_up.weight": (128, 64, Q.F16),
    "blk.0.attn_norm.weight": (64, None, Q.F32),
}


def _reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' integrations/ggml.py LlamaConverter._reverse_permute_weights."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _write(path, tensors, extra=None):
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    expected = {}
    for name, (N, K, qtype) in tensors.items():
        w = rng.standard_normal((N, K) if K else (N,)).astype(np.float32) * 0.1
        if qtype == Q.F32:
            writer.add_tensor(name, w)
        elif qtype == Q.F16:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
        expected[name] = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype) \
            if qtype not in (Q.F32, Q.F16) else w.astype(np.float16).astype(np.float32) if qtype == Q.F16 else w
    if extra:
        writer.add_tensor(extra, np.zeros((8, 66), np.uint8), raw_dtype=Q.IQ2_XXS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, _write(path, TENSORS)


def test_auto_keeps_bit_width_exactly(tiny_gguf):
    path, expected = tiny_gguf
    floats, packed = read_gguf(str(path), CONFIG, "auto")
    q, k = packed["model.layers.0.self_attn.q_proj.weight"], packed["model.layers.0.self_attn.k_proj.weight"]
    assert (q.bits, q.group_size, k.bits, k.group_size) == (4, 32, 4, 32)
    emb, down = packed["model.embed_tokens.weight"], packed["model.layers.0.mlp.down_proj.weight"]
    assert (emb.bits, emb.group_size, down.bits) == (8, 32, 8)
    want = {
        "model.embed_tokens.weight": expected["token_embd.weight"],
        "model.layers.0.self_attn.q_proj.weight": _reverse_permute(expected["blk.0.attn_q.weight"], 4),
        "model.layers.0.self_attn.k_proj.weight": _reverse_permute(expected["blk.0.attn_k.weight"], 2),
        "model.layers.0.mlp.down_proj.weight": expected["blk.0.ffn_down.weight"],
    }
    for name, w in want.items():
        assert torch.equal(packed[name].dequantize(), torch.from_numpy(w)), name
    assert torch.equal(floats["model.layers.0.mlp.up_proj.weight"],
                       torch.from_numpy(expected["blk.0.ffn_up.weight"]))
    assert torch.equal(floats["model.layers.0.input_layernorm.weight"],
                       torch.from_numpy(expected["blk.0.attn_norm.weight"]))
    # a 4.5-bit Q4_1 tensor costs 20 bytes per 32 weights in the file and in memory
    assert k.nbytes == 32 * 64 // 32 * 20


def test_none_and_explicit_widths(tiny_gguf):
    path, expected = tiny_gguf
    floats, packed = read_gguf(str(path), CONFIG, "none")
    assert not packed
    assert torch.equal(floats["model.layers.0.mlp.down_proj.weight"],
                       torch.from_numpy(expected["blk.0.ffn_down.weight"]))
    _, packed8 = read_gguf(str(path), CONFIG, "int8")
    assert all(p.bits == 8 and p.per_channel for p in packed8.values())
    assert "model.layers.0.mlp.up_proj.weight" in packed8       # F16 quantized on request
    _, packed4 = read_gguf(str(path), CONFIG, "int4")
    assert packed4["model.layers.0.mlp.down_proj.weight"].bits == 4
    assert packed4["model.embed_tokens.weight"].bits == 8           # policy: embeddings int8
    w = torch.from_numpy(expected["blk.0.ffn_down.weight"])
    err = (packed4["model.layers.0.mlp.down_proj.weight"].dequantize() - w).abs().max()
    assert err <= w.abs().max() / 15 + 1e-3


def test_unsupported_type_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.gguf"
    _write(path, {"blk.0.attn_norm.weight": (64, None, Q.F32)}, extra="blk.0.attn_v.weight")
    with pytest.raises(ValueError, match=r"unsupported GGUF tensor type\(s\) IQ2_XXS.*supported: F32"):
        read_gguf(str(path), CONFIG, "auto")


def test_packed_weight_is_what_the_layout_says(tiny_gguf):
    path, _ = tiny_gguf
    _, packed = read_gguf(str(path), CONFIG, "auto")
    k = packed["model.layers.0.self_attn.k_proj.weight"]
    assert isinstance(k, PackedWeight) and k.qweight.shape == (32, 32) and k.scales.shape == (32, 2)


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_row_chunks_convert_as_the_whole_tensor(tiny_gguf, monkeypatch, quantization):
    """Load memory: dequantized matrices go through float32 a chunk of rows at a time. One row per
    chunk must give exactly what the whole tensor gives: gguf's own dequantization of the whole
    tensor (q/k rows un-permuted), as is or packed by the layout's quantizers in one call."""
    path, expected = tiny_gguf
    monkeypatch.setattr(gguf_weights, "CHUNK_WEIGHTS", 1)
    floats, packed = read_gguf(str(path), CONFIG, quantization)
    checked = 0
    for gname, (N, K, qtype) in TENSORS.items():
        name, bits = hf_name(gname), target_bits(quantization, qtype.name, "token_embd" in gname)
        if K is None or (bits == 4 and qtype.name in EXACT_INT4):     # not dequantized
            continue
        w = expected[gname]
        if ".attn_q." in gname or ".attn_k." in gname:
            w = _reverse_permute(w, 4 if ".attn_q." in gname else 2)
        w = torch.from_numpy(np.ascontiguousarray(w))
        if bits is None:
            assert torch.equal(floats[name], w), name
        else:
            got, ref = packed[name], quantize_int8(w) if bits == 8 else quantize_int4(w, 32)
            assert got.shape == ref.shape and torch.equal(got.qweight, ref.qweight), name
            assert torch.equal(got.scales, ref.scales), name
            assert (got.mins is None) == (ref.mins is None), name
            assert got.mins is None or torch.equal(got.mins, ref.mins), name
        checked += 1
    assert checked >= 3             # int4: the Q4_0/Q4_1 matrices are kept exactly, not here
