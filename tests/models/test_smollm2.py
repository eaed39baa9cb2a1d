"""The real model: the bundled SmolLM2-135M-Instruct GGUF, greedy, equal to transformers."""

import os

import pytest
import torch

from localpaged import LLM, SamplingParams

pytestmark = pytest.mark.slow

CHATS = [
    [{"role": "user", "content": "Explain in a paragraph what a CPU does."}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "system", "content": "You are a helpful assistant who answers briefly."},
     {"role": "user", "content": "Give me three tips for learning to cook."}],
]


@pytest.fixture(scope="module")
def gguf(smollm2_gguf):
    return smollm2_gguf


def test_smollm2_chat_equals_transformers(gguf):
    from transformers import AutoModelForCausalLM
    llm = LLM(gguf, num_kv_blocks=128, quantization="none")   # the weights transformers runs
    params = SamplingParams(temperature=0.0, max_tokens=40)
    outs = llm.chat(CHATS, params)
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                              dtype=torch.float32)
    for chat, out in zip(CHATS, outs):
        ids = llm.apply_chat_template(chat)
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)
        assert out.outputs[0].token_ids == ref[0, len(ids):].tolist()
        assert len(out.outputs[0].token_ids) >= 32
    # Stop strings split across tokens, and EOS, end a reply as a user expects.
    france = [{"role": "user", "content": "What is the capital of France?"}]
    eos = llm.chat(france, SamplingParams(temperature=0.0, max_tokens=60))[0].outputs[0]
    assert "Paris" in eos.text
    assert eos.finish_reason == "stop" and eos.token_ids[-1] in llm.engine.eos_token_ids
    stop = llm.chat(france, SamplingParams(temperature=0.0, max_tokens=40, stop=["of Fr"]))[0]
    assert stop.outputs[0].finish_reason == "stop" and stop.outputs[0].stop_reason == "of Fr"
    assert "of Fr" not in stop.outputs[0].text and stop.outputs[0].text.endswith("capital ")
