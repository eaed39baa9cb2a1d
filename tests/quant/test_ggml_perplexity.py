"""Perplexity of the committed llama.cpp-quantized tiny GGUFs (tests/data/ggml/*.gguf), loaded
with the default quantization "auto" and multiplied by the CPU extension's GGML kernel, is within
0.5% of llama.cpp's on the same file and the same token ids (recorded by
tests/data/record_ggml_perplexity.py in tests/data/ggml/llamacpp_perplexity.json).

Without the kernel in the built extension, "auto" would fall back to requantizing: that is a
failure here, not a skip.
"""

from __future__ import annotations

import json
import os

import pytest

from localpaged import LLM
from localpaged.quant.ggml import GgmlWeight, PartsWeight
from localpaged.runner.prompt_logprobs import perplexity

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "ggml")
with open(os.path.join(DATA, "llamacpp_perplexity.json")) as _f:
    RECORD = json.load(_f)
TOLERANCE = 0.005


def ggml_weights(llm) -> list[GgmlWeight]:
    out = []
    for m in llm.engine.model.modules():
        w = getattr(m, "packed", None)
        out += w.parts if isinstance(w, PartsWeight) else [w] if w is not None else []
    return out


def test_every_committed_file_is_recorded():
    files = sorted(f for f in os.listdir(DATA) if f.endswith(".gguf"))
    assert files == sorted(RECORD["perplexity"]), "run tests/data/record_ggml_perplexity.py"
    assert len(RECORD["tokens"]["ids"]) == RECORD["tokens"]["n"]


@pytest.mark.parametrize("name", sorted(RECORD["perplexity"]))
def test_perplexity_matches_llamacpp(name, cpu_ext):
    assert hasattr(cpu_ext, "ggml_matmul"), "the built CPU extension has no GGML kernel"
    ids = RECORD["tokens"]["ids"]
    llm = LLM(os.path.join(DATA, name), num_kv_blocks=len(ids) // 16 + 2)
    weights = ggml_weights(llm)
    assert weights and all(isinstance(w, GgmlWeight) and w.kernel is not None for w in weights), \
        f"{name}: not every weight is kept natively with the CPU kernel: {llm.stats().weights_format}"
    ours, theirs = perplexity(llm, ids), RECORD["perplexity"][name]
    assert abs(ours / theirs - 1) <= TOLERANCE, \
        f"{name}: perplexity {ours:.4f}, llama.cpp {theirs:.4f} (ratio {ours / theirs:.5f})"
