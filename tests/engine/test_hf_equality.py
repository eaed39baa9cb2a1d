"""Greedy output of the engine equals transformers' generate, token for token."""

import zlib

import pytest
from helpers import tiny_models
from helpers.engine_helpers import greedy, hf_greedy, prompts

from localpaged import LLM


@pytest.mark.parametrize("kind", list(tiny_models.CONFIGS))
def test_tiny_models_equal_transformers(kind, tiny_root):
    path = tiny_models.build(kind, tiny_root)
    llm = LLM(path, num_kv_blocks=96, dtype="float32")   # transformers' dtype (on CUDA too)
    batch = prompts(5, seed=zlib.crc32(kind.encode()) % 1000)   # the same in every process
    outs = llm.generate(batch, greedy(32))
    for prompt, out in zip(batch, outs):
        assert out.outputs[0].token_ids == hf_greedy(path, prompt, 32)
        assert out.outputs[0].finish_reason == "length"
    assert llm.stats().blocks_in_use == 0


def test_unsupported_architecture_is_refused(tmp_path):
    from transformers import GPT2Config
    GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="unsupported architecture GPT2LMHeadModel; supported: .*LlamaForCausalLM"):
        LLM(str(tmp_path))
