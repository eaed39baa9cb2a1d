"""A quantized GGUF keeps its own block formats whether or not the CPU extension is built yet.

- Not built and cannot be: the formats are multiplied by the plain-torch reference, a warning
  says so, stats() names "reference", and greedy output equals the extension's up to a near-tie
  (the extension quantizes activations to int8 per block: helpers/quant_helpers.py margin_rule).
- Not built yet: the load waits for the build, with a line saying it compiles the CPU kernels
  once, and then serves the file's formats by the extension.
- int4 only where asked: no log line and no stats field says int4 otherwise.
"""

from __future__ import annotations

import logging
import time

import pytest
from helpers.engine_helpers import greedy, prompts, token_ids
from helpers.ggml_models import committed
from helpers.quant_helpers import compare_where_margins_allow

from localpaged import LLM
from localpaged.kernels import cpu_extension

MARGIN = 0.6          # as tests/quant/test_ggml_engine.py: the int8 activations' largest moves
N_NEW = 12
FORMATS = {"Q4_K", "Q6_K", "float32"}          # tiny-llama-Q4_K_M.gguf's


def unbuilt(monkeypatch, compile_fn) -> cpu_extension.Build:
    """A fresh, unstarted build in place of the process's, compiling with compile_fn."""
    build = cpu_extension.Build()
    monkeypatch.setattr(cpu_extension, "BUILD", build)
    monkeypatch.setattr(cpu_extension, "_built_before", lambda: False)
    monkeypatch.setattr(cpu_extension, "_compile", compile_fn)
    return build


def no_compiler():
    raise RuntimeError("error: command 'g++' failed: No such file or directory")


@pytest.fixture(scope="module")
def with_extension(cpu_ext):
    return LLM(committed("Q4_K_M"), num_kv_blocks=64)


def test_no_compiler_serves_the_files_formats_by_the_reference(with_extension, monkeypatch, caplog):
    unbuilt(monkeypatch, no_compiler)
    with caplog.at_level(logging.INFO):
        llm = LLM(committed("Q4_K_M"), num_kv_blocks=64)
    stats = llm.stats()
    assert stats.kernels == "reference"
    assert set(stats.weight_formats) == set(with_extension.stats().weight_formats) == FORMATS
    assert stats.weights_format.startswith("Q4_K ·")
    assert "plain-torch reference" in caplog.text
    assert "int4" not in caplog.text
    assert with_extension.stats().kernels.startswith("cpu extension (")
    compared = 0
    for p in prompts(3, seed=21):
        ref_ids = token_ids(llm.generate([p], greedy(N_NEW)))[0][0]
        got = token_ids(with_extension.generate([p], greedy(N_NEW)))[0][0]
        compared += compare_where_margins_allow(llm, with_extension, p, ref_ids, got, MARGIN)
    assert compared >= N_NEW, "the margin rule compared almost nothing"


def test_a_first_build_is_waited_for_with_a_progress_line(cpu_ext, monkeypatch, caplog):
    def slow_compile():
        time.sleep(0.5)
        return cpu_ext
    build = unbuilt(monkeypatch, slow_compile)
    monkeypatch.setattr(cpu_extension, "CACHED_LOAD_S", 0.0)
    with caplog.at_level(logging.INFO):
        llm = LLM(committed("Q4_K_M"), num_kv_blocks=16)
    assert build.module is cpu_ext
    assert "compiling the CPU kernels once for this machine" in caplog.text
    assert "CPU kernels compiled in" in caplog.text
    assert llm.stats().kernels == cpu_extension.describe(cpu_ext)
    assert set(llm.stats().weight_formats) == FORMATS


def test_int4_only_where_asked(monkeypatch):
    unbuilt(monkeypatch, no_compiler)
    stats = LLM(committed("Q4_K_M"), num_kv_blocks=16, quantization="int4").stats()
    assert stats.weights_format.startswith("int4 g32 ·")
    assert not {"Q4_K", "Q6_K"} & set(stats.weight_formats)
