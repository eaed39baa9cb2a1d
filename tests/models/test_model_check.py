"""A model whose config or weights are wrong is refused at load with a ValueError naming the
field or the tensor and the file, before a weight is read or a kernel runs; a model switch to
such a model keeps the running one serving, requests in flight included.

Models are the tiny ones of tests/helpers/tiny_models.py (safetensors) and tests/helpers/ggml_models.py (GGUF),
copied and damaged one field or one tensor at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from helpers import ggml_models
import pytest
import torch
from safetensors.torch import load_file, save_file
from helpers.step_gate import StepGate
from helpers.tiny_models import build

from localpaged import LLM
from localpaged.runner import loader


def copy_model(src: str, dst) -> str:
    dst = str(dst)
    shutil.copytree(src, dst)
    return dst


def edit_config(path: str, **fields) -> str:
    """Set (or, with value ..., delete) fields of path/config.json."""
    file = os.path.join(path, "config.json")
    with open(file) as f:
        config = json.load(f)
    for key, value in fields.items():
        target, _, inner = key.partition("__")      # rope_parameters__rope_theta
        if inner:
            config[target][inner] = value
        elif value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    with open(file, "w") as f:
        json.dump(config, f)
    return file


def edit_tensor(path: str, name: str, change) -> str:
    """Replace tensor `name` of path/model.safetensors by change(tensor) (None: add it anew)."""
    file = os.path.join(path, "model.safetensors")
    state = load_file(file)
    state[name] = change(state.get(name))
    save_file(state, file, metadata={"format": "pt"})
    return path


def one_row_less(t: torch.Tensor) -> torch.Tensor:
    return t[:-1].clone()


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Fail if the loader reads any weights (the checks must come first)."""
    def refuse(*args, **kwargs):
        raise AssertionError("weights were read before the model was refused")
    for name in ("_safetensors_state_dict", "read_gguf", "read_safetensors"):
        monkeypatch.setattr(loader, name, refuse)


# ---- config fields ------------------------------------------------------------------------------
@pytest.mark.parametrize("fields,field", [
    ({"hidden_size": 0}, "hidden_size"),
    ({"hidden_size": 10**9}, "hidden_size"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"head_dim": 0}, "head_dim"),
    ({"head_dim": 15}, "head_dim"),
    ({"intermediate_size": -1}, "intermediate_size"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"num_hidden_layers": 10**6}, "num_hidden_layers"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
    ({"rms_norm_eps": float("inf")}, "rms_norm_eps"),
    ({"rope_parameters__rope_theta": 0.0}, "rope_theta"),
    ({"rope_parameters__rope_theta": -1.0}, "rope_theta"),
])
def test_bad_config_field_is_refused_naming_it(tiny_llama, tmp_path, no_weight_reads, fields,
                                               field):
    file = edit_config(copy_model(tiny_llama, tmp_path / "m"), **fields)
    with pytest.raises(ValueError, match=field) as err:
        LLM(os.path.dirname(file), num_kv_blocks=4)
    assert file in str(err.value)


def test_hidden_size_without_head_dim_must_divide_into_heads(tiny_root, tmp_path,
                                                             no_weight_reads):
    path = copy_model(build("qwen2-bias", tiny_root), tmp_path / "m")    # Qwen2: no head_dim
    edit_config(path, hidden_size=66, head_dim=...)
    with pytest.raises(ValueError, match="hidden_size must be a multiple of num_attention_heads"):
        LLM(path, num_kv_blocks=4)


def test_zero_hidden_size_is_an_error_not_a_crash(tiny_llama, tmp_path):
    """In a process of its own: a kernel dividing by zero would kill it with SIGFPE."""
    path = copy_model(tiny_llama, tmp_path / "m")
    edit_config(path, hidden_size=0)
    code = f"from localpaged import LLM\nLLM({path!r}, num_kv_blocks=4)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 1, (run.returncode, run.stderr[-2000:])
    assert "ValueError: hidden_size must be a positive integer" in run.stderr


def test_bad_gguf_metadata_is_refused_naming_the_field_and_file(tmp_path, monkeypatch,
                                                                no_weight_reads):
    import gguf
    add = gguf.GGUFWriter.add_head_count_kv
    monkeypatch.setattr(gguf.GGUFWriter, "add_head_count_kv", lambda self, n: add(self, 3))
    path = ggml_models.write_tiny_gguf(tmp_path / "bad.gguf")
    with pytest.raises(ValueError, match="num_key_value_heads must divide") as err:
        LLM(path, num_kv_blocks=4)
    assert path in str(err.value)


# ---- weight shapes: safetensors -----------------------------------------------------------------
@pytest.mark.parametrize("kind,name,want", [
    ("llama-gqa", "model.layers.0.self_attn.q_proj.weight", "64x64"),   # 4 heads of 16
    ("llama-gqa", "model.layers.1.self_attn.k_proj.weight", "32x64"),   # 2 KV heads of 16
    ("llama-gqa", "model.layers.0.self_attn.v_proj.weight", "32x64"),
    ("llama-gqa", "model.layers.0.self_attn.o_proj.weight", "64x64"),
    ("llama-gqa", "model.layers.0.mlp.down_proj.weight", "64x128"),
    ("llama-gqa", "model.layers.1.post_attention_layernorm.weight", "64"),
    ("llama-gqa", "model.norm.weight", "64"),
    ("llama-gqa", "lm_head.weight", "512x64"),                          # untied
    ("llama-mqa-tied", "model.embed_tokens.weight", "512x64"),          # tied: the one table
    ("llama-mqa-tied", "model.layers.0.self_attn.k_proj.weight", "16x64"),  # 1 KV head
    ("qwen2-bias", "model.layers.0.self_attn.k_proj.bias", "32"),
    ("qwen2-bias", "model.layers.1.self_attn.q_proj.bias", "64"),
    ("qwen3", "model.layers.0.self_attn.q_norm.weight", "32"),
    ("qwen3", "model.layers.0.self_attn.q_proj.weight", "128x64"),      # 4 heads of 32
])
def test_safetensors_tensor_of_another_shape_is_refused_naming_it(tiny_root, tmp_path,
                                                                   no_weight_reads, kind, name,
                                                                   want):
    path = edit_tensor(copy_model(build(kind, tiny_root), tmp_path / "m"), name, one_row_less)
    with pytest.raises(ValueError, match=rf"{name}: shape \d+(x\d+)? does not match the "
                                         rf"model's {want} = ") as err:
        LLM(path, num_kv_blocks=4)
    assert path in str(err.value)


def test_a_tensor_of_a_layer_the_config_lacks_is_refused(tiny_llama, tmp_path, no_weight_reads):
    name = "model.layers.2.mlp.down_proj.weight"
    path = edit_tensor(copy_model(tiny_llama, tmp_path / "m"), name,
                       lambda _: torch.zeros(64, 128))
    with pytest.raises(ValueError, match=rf"{name}: layer 2, but the config has "
                                         r"num_hidden_layers=2"):
        LLM(path, num_kv_blocks=4)


def test_the_checked_copy_still_loads(tiny_llama, tmp_path):
    """The damage helpers change only what they are asked to: an undamaged copy loads."""
    path = copy_model(tiny_llama, tmp_path / "m")
    edit_tensor(path, "model.norm.weight", lambda t: t)
    assert LLM(path, num_kv_blocks=4).generate([[1, 2, 3]])[0].outputs[0].token_ids


# ---- weight shapes: GGUF ------------------------------------------------------------------------
@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
@pytest.mark.parametrize("gguf_name,name,want", [
    ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", "128x256"),
    ("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", "256x256"),
    ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight", "512x256"),
    ("output.weight", "lm_head.weight", "512x256"),
    ("token_embd.weight", "model.embed_tokens.weight", "512x256"),
    ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight", "256"),
])
def test_gguf_tensor_of_another_shape_is_refused_naming_it(tmp_path, monkeypatch,
                                                           no_weight_reads, tensor_type,
                                                           gguf_name, name, want):
    tensors = ggml_models.gguf_tensors

    def damaged(arch, seed):
        out = tensors(arch, seed)
        out[gguf_name] = out[gguf_name][:-32]        # whole quantization blocks less
        return out
    monkeypatch.setattr(ggml_models, "gguf_tensors", damaged)
    path = ggml_models.write_tiny_gguf(tmp_path, tensor_type=tensor_type)
    with pytest.raises(ValueError, match=rf"{name}: shape \d+(x\d+)? does not match the "
                                         rf"model's {want} = .*tensor {gguf_name} of "
                                         rf"{path}"):
        LLM(path, num_kv_blocks=4)


def test_gguf_qwen2_bias_of_another_shape_is_refused(tmp_path, monkeypatch, no_weight_reads):
    tensors = ggml_models.gguf_tensors

    def damaged(arch, seed):
        out = tensors(arch, seed)
        out["blk.0.attn_v.bias"] = out["blk.0.attn_v.bias"][:-1]
        return out
    monkeypatch.setattr(ggml_models, "gguf_tensors", damaged)
    path = ggml_models.write_tiny_gguf(tmp_path, arch="qwen2", tensor_type="Q8_0")
    with pytest.raises(ValueError, match=r"self_attn.v_proj.bias: shape 127 does not match "
                                         r"the model's 128 = num_key_value_heads\*head_dim"):
        LLM(path, num_kv_blocks=4)


# ---- a failed model switch ----------------------------------------------------------------------
def test_a_failed_switch_keeps_the_running_model_and_its_requests(tiny_llama, tmp_path):
    from helpers.api_server import chat_msgs, serve_switchable, stop_server, wait_idle
    bad = copy_model(tiny_llama, tmp_path / "bad")
    edit_config(bad, num_key_value_heads=3)
    llm = LLM(tiny_llama, num_kv_blocks=64)
    first, mm, server, c = serve_switchable(llm)
    try:
        running = iter(c.chat.completions.create(
            model=first.model_name, messages=chat_msgs(1), max_tokens=20, stream=True,
            extra_body={"ignore_eos": True}))
        with StepGate(llm.engine) as held:           # the request runs through the failed load
            next(running)
            held.wait_held()
            job = mm.load(bad)
            assert job.done.wait(60)
        assert "ValueError: num_key_value_heads must divide" in job.error
        assert "Still using" in mm.status() and mm.backend is first
        assert [ch.choices[0].finish_reason for ch in running if ch.choices][-1] == "length"
        reply = c.chat.completions.create(model=first.model_name, messages=chat_msgs(2),
                                          max_tokens=4)
        assert reply.usage.completion_tokens == 4
        wait_idle(first.engine)
    finally:
        stop_server(server)
        first.engine.shutdown()
