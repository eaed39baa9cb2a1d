"""The bundled SmolLM2 Q4_1 GGUF: int4 keeps the Q4_1 blocks exactly, in about the file's size.

Perplexity over tests/data/paragraph.txt, through prompt logprobs (what an evaluation client
reads). Tolerances: int8 (every weight requantized per channel) within 1% of the float32 model
(the weights transformers runs); int4 (the Q4_1 blocks, bf16 activations and
scales in torch's CPU kernel) no further from float32 than llama.cpp's own Q4_1 is on the same
token ids: recorded once in tests/data/paragraph_llamacpp.json by `python bench/perplexity.py
--record` (llama-cpp-python 0.3.36: 31.055 vs float32 31.667, -1.9%; ours +0.9%).
"""

import json
import os

import gguf as gguf_pkg
import pytest

from localpaged import LLM
from localpaged.runner.prompt_logprobs import perplexity

pytestmark = pytest.mark.slow
TEXT = os.path.join(os.path.dirname(__file__), "..", "data", "paragraph.txt")
LLAMACPP = os.path.join(os.path.dirname(__file__), "..", "data", "paragraph_llamacpp.json")


@pytest.fixture(scope="module")
def ppl(smollm2_gguf):                   # the bundled GGUF: a required part (conftest)
    out = {}
    for q in ("none", "int4", "int8", "auto"):
        llm = LLM(smollm2_gguf, quantization=q, num_kv_blocks=16)
        ids = llm.tokenizer(open(TEXT).read().strip())["input_ids"]
        assert 120 <= len(ids) <= 160
        out[q] = (perplexity(llm, ids), llm.stats())
    return out


def test_int4_within_file_size(ppl, smollm2_gguf):
    tensor_bytes = sum(int(t.n_bytes) for t in gguf_pkg.GGUFReader(smollm2_gguf).tensors)
    stats = ppl["int4"][1]
    assert stats.weights_format.startswith("int4 g32 ·")
    assert stats.weights_bytes <= 1.15 * tensor_bytes
    assert ppl["none"][1].weights_bytes > 5 * tensor_bytes        # float32 for comparison


def test_auto_keeps_the_file_as_it_is(ppl, smollm2_gguf, cpu_ext):
    """The default: the Q4_1 / Q8_0 blocks as the file has them, on the CPU extension's integer
    kernel; no further from float32 than llama.cpp on the same file (its arithmetic: int8
    activations per block)."""
    assert hasattr(cpu_ext, "ggml_matmul")
    tensor_bytes = sum(int(t.n_bytes) for t in gguf_pkg.GGUFReader(smollm2_gguf).tensors)
    auto, stats = ppl["auto"]
    assert stats.weights_format.startswith("Q4_1 ·")
    assert tensor_bytes <= stats.weights_bytes <= 1.02 * tensor_bytes
    llamacpp, fp32 = json.load(open(LLAMACPP))["llama.cpp Q4_1"], ppl["none"][0]
    assert abs(auto - fp32) <= abs(llamacpp - fp32)


def test_perplexity(ppl):
    fp32, int4, int8 = ppl["none"][0], ppl["int4"][0], ppl["int8"][0]
    assert 10 < fp32 < 200                        # a sane English perplexity for a 135M model
    llamacpp = json.load(open(LLAMACPP))["llama.cpp Q4_1"]
    assert abs(int4 - fp32) <= abs(llamacpp - fp32)
    assert abs(int8 - fp32) <= 1e-2 * fp32
