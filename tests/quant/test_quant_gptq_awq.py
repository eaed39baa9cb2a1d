"""4-bit GPTQ / AWQ safetensors checkpoints load onto the int4 kernels, exactly.

The test quantizes a tiny random Llama's linear weights itself and packs them the way the
formats' writers do (written here from the formats' spec, independently of the loader):
- GPTQ (AutoGPTQ / gptqmodel `pack`): qweight int32 [K/8, N], value j of word [i, n] is
  q[n, 8i + j] in bits 4j..; qzeros int32 [K/G, N/8], value j of word [g, c] is the zero of
  column 8c + j; format "gptq" (v1) stores zero - 1, "gptq_v2" the zero; g_idx = k // G.
- AWQ GEMM (AutoAWQ `WQLinear_GEMM.from_linear`): qweight int32 [K, N/8], value i of word [k, c]
  is q[8c + ORDER[i], k] with ORDER = [0, 2, 4, 6, 1, 3, 5, 7]; qzeros the same along N.
Dequantized weights w = (q - z) * s computed here are the oracle: the loader's canonical weights
equal them bit for bit, and an fp32 model saved with them is the reference for greedy output.
"""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from helpers.engine_helpers import greedy, prompts, token_ids
from helpers.quant_helpers import compare_where_margins_allow
from safetensors.torch import load_file, save_file

from localpaged import LLM
from localpaged.quant.gptq_awq import read_prequantized

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
N_NEW = 12
MARGIN = 0.002        # logits; the int4 path's measured deviation from fp32 is ~0.0004
# (name, quantization_config, symmetric): v1 asymmetric, v2 symmetric, AWQ (its config spelling)
VARIANTS = {
    "gptq-v1-g32": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False,
                     "desc_act": False, "checkpoint_format": "gptq"}, False),
    "gptq-v2-g64-sym": ({"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True,
                         "desc_act": False, "format": "gptq_v2"}, True),
    "awq-g32": ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                 "version": "gemm"}, False),
}


def quantize(w: torch.Tensor, G: int, sym: bool, zmin: int):
    """Round-to-nearest int4 per group along K: q [N, K], z and s [N, K/G] (s fp16)."""
    N, K = w.shape
    g = w.view(N, K // G, G)
    if sym:
        s = (g.abs().amax(-1) / 7).half()
        z = torch.full_like(s, 8, dtype=torch.int64)
    else:
        lo, hi = g.amin(-1), g.amax(-1)
        s = ((hi - lo) / 15).half()
        z = torch.round(-lo / s.float()).long().clamp(zmin, 15)
    q = (torch.round(g / s.float()[..., None]) + z[..., None]).clamp(0, 15).long().view(N, K)
    return q, z, s


def dequantize(q, z, s, G):
    N, K = q.shape
    return ((q.view(N, K // G, G) - z[..., None]).float() * s.float()[..., None]).view(N, K)


def pack_rows(v: torch.Tensor, order=range(8)) -> torch.Tensor:
    """[R, C] values 0..15 -> int32 [R, C/8]: value i of a word = column 8c + order[i]."""
    v = v.numpy().astype(np.uint32).reshape(v.shape[0], -1, 8)[..., list(order)]
    words = sum(v[..., i] << np.uint32(4 * i) for i in range(8))
    return torch.from_numpy(np.ascontiguousarray(words, dtype=np.uint32).view(np.int32))


def write_checkpoint(src: str, dst: str, qc: dict, sym: bool) -> dict[str, torch.Tensor]:
    """dst: src's model with its linears packed per `qc`; returns the dequantized weights."""
    G, method = qc["group_size"], qc["quant_method"]
    v1 = method == "gptq" and qc.get("checkpoint_format") == "gptq"
    state = load_file(os.path.join(src, "model.safetensors"))
    out, deq = {}, {}
    for name, w in state.items():
        prefix = name.removesuffix(".weight")
        if not prefix.endswith(LINEARS):
            out[name] = w
            continue
        q, z, s = quantize(w.float(), G, sym, zmin=1 if v1 else 0)     # v1 cannot store zero 0
        deq[name] = dequantize(q, z, s, G)
        if method == "gptq":
            out[f"{prefix}.qweight"] = pack_rows(q).t().contiguous()           # [K/8, N]
            out[f"{prefix}.qzeros"] = pack_rows(z.t() - (1 if v1 else 0))     # [K/G, N/8]
            out[f"{prefix}.g_idx"] = (torch.arange(q.shape[1]) // G).int()
            if f"{prefix}.bias" not in state:     # AutoGPTQ-style zero bias on bias-free layers
                out[f"{prefix}.bias"] = torch.zeros(q.shape[0], dtype=torch.float16)
        else:
            out[f"{prefix}.qweight"] = pack_rows(q.t(), AWQ_ORDER)            # [K, N/8]
            out[f"{prefix}.qzeros"] = pack_rows(z.t(), AWQ_ORDER)             # [K/G, N/8]
        out[f"{prefix}.scales"] = s.t().contiguous()                           # [K/G, N] fp16
    os.makedirs(dst)
    for f in os.listdir(src):
        if f != "model.safetensors":
            shutil.copy(os.path.join(src, f), dst)
    save_file(out, os.path.join(dst, "model.safetensors"))
    set_quantization_config(dst, qc)
    return deq


def set_quantization_config(path: str, qc: dict | None) -> None:
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    if qc is not None:
        config["quantization_config"] = qc
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


@pytest.fixture(scope="module", params=list(VARIANTS))
def checkpoint(request, tiny_llama, tmp_path_factory):
    """(variant, packed dir, its dequantized weights, an fp32 dir with exactly those weights)."""
    qc, sym = VARIANTS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    deq = write_checkpoint(tiny_llama, str(root / "q"), qc, sym)
    ref = str(root / "ref")
    shutil.copytree(tiny_llama, ref)
    state = load_file(os.path.join(ref, "model.safetensors")) | deq
    save_file(state, os.path.join(ref, "model.safetensors"))
    return request.param, str(root / "q"), deq, ref


def test_canonical_weights_equal_the_checkpoints_exactly(checkpoint):
    variant, path, deq, _ = checkpoint
    qc, _ = VARIANTS[variant]
    floats, packed = read_prequantized(path, qc, "auto", torch.float32)
    assert set(packed) == set(deq)
    for name, w in deq.items():
        assert packed[name].bits == 4 and packed[name].group_size == qc["group_size"]
        assert torch.equal(packed[name].dequantize(torch.float32), w), name
    assert not any(k.endswith(("qweight", "qzeros", "scales", "g_idx")) for k in floats)
    # explicit widths: "int4" keeps the checkpoint's int4 and makes the float embeddings int8;
    # "int8" requantizes every linear (per channel: error <= half a step of its row)
    _, as_int4 = read_prequantized(path, qc, "int4", torch.float32)
    assert as_int4["model.embed_tokens.weight"].bits == 8
    assert all(torch.equal(as_int4[n].dequantize(), w) for n, w in deq.items())
    _, as_int8 = read_prequantized(path, qc, "int8", torch.float32)
    for name, w in deq.items():
        pw = as_int8[name]
        assert pw.bits == 8 and pw.per_channel
        assert ((pw.dequantize() - w).abs() <= pw.scales[:, None] / 2 + 1e-7).all()


def test_greedy_equals_fp32_of_the_same_weights(checkpoint):
    """"none" (dequantized floats) equals the fp32 model token for token. "auto" keeps int4 and
    runs torch's packed CPU op, which takes bf16 activations and bf16 scales: logits move by
    ~0.0004 (measured, all variants; asserted < MARGIN / 2) while this random model's top-2
    margins go down to 0.0000, so greedy int4 equals fp32 up to their first difference, which
    must fall at a step whose fp32 margin is below MARGIN, and at every teacher-forced position
    with a clear fp32 winner."""
    variant, path, deq, ref = checkpoint
    batch = prompts(6, seed=5)
    fp = LLM(ref, num_kv_blocks=64)
    want = [fp.generate([p], greedy(N_NEW))[0].outputs[0].token_ids for p in batch]
    none = LLM(path, num_kv_blocks=64, quantization="none")     # dequantized: the same floats
    qkv = none.engine.model.model.layers[0].self_attn.qkv_proj.weight
    parts = [deq[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
    assert torch.equal(qkv, torch.cat(parts))
    assert [o.outputs[0].token_ids for o in none.generate(batch, greedy(N_NEW))] == want
    int4 = LLM(path, num_kv_blocks=64)                          # auto keeps the int4
    assert int4.stats().weights_format.startswith(f"int4 g{VARIANTS[variant][0]['group_size']} ·")
    alone = token_ids([int4.generate([p], greedy(N_NEW))[0] for p in batch])
    assert token_ids(int4.generate(batch, greedy(N_NEW))) == alone  # batch invariance: exact
    compared = sum(compare_where_margins_allow(fp, int4, p, ref_ids, got[0], MARGIN)
                   for p, ref_ids, got in zip(batch, want, alone))
    assert compared >= len(batch) * 8        # generated tokens compared: two in three, at least


def test_biased_model_keeps_its_biases(tiny_root, tmp_path):
    """Qwen2's real q/k/v biases load next to packed weights (fused like the weights)."""
    from helpers import tiny_models
    src = tiny_models.build("qwen2-bias", tiny_root)
    qc, sym = VARIANTS["gptq-v1-g32"]
    write_checkpoint(src, str(tmp_path / "q"), qc, sym)
    state = load_file(os.path.join(src, "model.safetensors"))
    want = torch.cat([state[f"model.layers.1.self_attn.{p}_proj.bias"] for p in "qkv"])
    assert want.abs().sum() > 0
    for quantization in ("auto", "none"):
        llm = LLM(str(tmp_path / "q"), num_kv_blocks=8, quantization=quantization)
        assert torch.equal(llm.engine.model.model.layers[1].self_attn.qkv_proj.bias, want)


@pytest.mark.parametrize("change, message", [
    ({"bits": 8}, r"gptq checkpoint with bits=8: only bits=4 is supported"),
    ({"group_size": 16}, r"group_size=16: supported group sizes are 32, 64, 128"),
    ({"quant_method": "bitsandbytes"}, r"quant_method 'bitsandbytes' is not supported; "
                                       r"supported pre-quantized checkpoints: gptq, awq"),
    ({"checkpoint_format": "marlin"}, r"gptq checkpoint_format 'marlin' is not supported; "
                                      r"supported: gptq, gptq_v2"),
    ({"quant_method": "awq", "version": "gemv"}, r"awq version 'gemv' is not supported; supported: gemm"),
])
def test_unsupported_configs_are_clear_errors(tiny_llama, tmp_path, change, message):
    qc = VARIANTS["gptq-v1-g32"][0]
    write_checkpoint(tiny_llama, str(tmp_path / "q"), qc, False)
    set_quantization_config(str(tmp_path / "q"), qc | change)
    with pytest.raises(ValueError, match=message):
        LLM(str(tmp_path / "q"), num_kv_blocks=8)


def test_act_order_is_refused(tiny_llama, tmp_path):
    qc = VARIANTS["gptq-v1-g32"][0] | {"desc_act": True}
    path = str(tmp_path / "q")
    write_checkpoint(tiny_llama, path, qc, False)
    state = load_file(os.path.join(path, "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.g_idx"
    state[name] = state[name][torch.randperm(len(state[name]), generator=torch.Generator().manual_seed(0))]
    save_file(state, os.path.join(path, "model.safetensors"))
    with pytest.raises(ValueError, match=r"q_proj: GPTQ with desc_act .* supported: desc_act=false"):
        LLM(path, num_kv_blocks=8)


def test_partial_groups_are_refused(tiny_llama, tmp_path):
    qc = VARIANTS["awq-g32"][0]
    path = str(tmp_path / "q")
    write_checkpoint(tiny_llama, path, qc, False)
    state = load_file(os.path.join(path, "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.scales"
    state[name] = state[name][:-1].contiguous()          # as if K were not a multiple of G
    save_file(state, os.path.join(path, "model.safetensors"))
    with pytest.raises(ValueError, match=r"down_proj: packed tensors of a 64x128 weight do not "
                                         r"match group_size 32 .*in_features divisible"):
        LLM(path, num_kv_blocks=8)
