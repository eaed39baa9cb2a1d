"""GGUF block formats kept natively (quant/ggml.py) keep the engine's guarantees.

Oracle: transformers' own GGUF loader (`from_pretrained(dir, gguf_file=...)`), which dequantizes
every tensor with gguf-py, i.e. the float model the file describes.
- With the reference kernel (kernels/ggml_reference.py dequantize, then F.linear: what
  transformers computes), greedy output equals transformers' token for token, for every format
  and for a Q4_K_M file whose layers mix formats: this tests the loading (views of the mapped
  file, llama.cpp's q/k row order undone, fusion where parts share a format, PartsWeight where
  they do not).
- With the CPU extension's integer kernel (activations quantized to int8 per block, as llama.cpp
  does), greedy equals transformers' up to a near-tie (tests/helpers/quant_helpers.py: margin_rule), and
  batching, prefix hits and preemption change no token; nor does the interleaved layout its
  Q4_K, Q5_K and Q6_K weights are kept in (x8: the same logprobs, bit for bit, as GGUF's rows).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest
import torch
from helpers.engine_helpers import greedy, prompts, token_ids
from helpers.ggml_models import committed, write_tiny_gguf
from helpers.quant_helpers import compare_where_margins_allow
from transformers import AutoModelForCausalLM

from localpaged import LLM, SamplingParams
from localpaged.kernels import ggml_reference
from localpaged.quant.ggml import GgmlWeight, NativeKernel, PartsWeight
from localpaged.quant.gguf_file import GgufFile
from localpaged.runner import loader

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "ggml")
WRITTEN = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")       # gguf-py's quantizer writes these
# llama.cpp-made files that together hold every other format (Q5_K_M, Q6_K hold no new one)
FILES = ("Q4_K_M", "qwen2-Q4_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "IQ4_NL")
N_NEW = 12
# The integer kernel quantizes activations to int8 per block (as llama.cpp): on these models
# (logits' std ~1.3) that moves logits by ~0.03 on average and by 0.15-0.28 at most (measured
# per format: Q8_0 0.19, Q4_0 0.15, Q6_K 0.28), so a race closer than MARGIN may flip.
MARGIN = 0.6
NEAR_TIE = 0.05      # a top-2 logprob gap the CPU kernels' rounding can close (see its use)


def reference_matmul(x: torch.Tensor, data: torch.Tensor, type_id: int) -> torch.Tensor:
    return x @ ggml_reference.dequantize(data, ggml_reference.format_for_type_id(type_id).name).T


REFERENCE = NativeKernel(reference_matmul, frozenset(ggml_reference.FORMATS))





@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Q8_0 everywhere, and MIXED: the 2-D weights in WRITTEN's formats in turn."""
    root = tmp_path_factory.mktemp("ggml")
    return {t: write_tiny_gguf(str(root / f"tiny-{t}.gguf"), tensor_type=t) for t in ("Q8_0", "MIXED")}


@functools.lru_cache(maxsize=4)
def hf_gguf(path: str):
    folder, name = os.path.split(path)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def hf_greedy(path: str, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = hf_gguf(path).generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                                     do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def with_reference(monkeypatch) -> None:
    monkeypatch.setattr(loader, "cpu_native", lambda: REFERENCE)


def linears(llm) -> dict[str, object]:
    return {name: m.packed for name, m in llm.engine.model.named_modules() if hasattr(m, "packed")}


def test_reference_kernel_equals_transformers(written, monkeypatch):
    with_reference(monkeypatch)
    path = written["MIXED"]
    llm = LLM(path, num_kv_blocks=64)
    assert {k for w in linears(llm).values() for k in w.formats()} == set(WRITTEN)
    batch = prompts(3, seed=5)
    assert token_ids(llm.generate(batch, greedy(N_NEW))) == [[hf_greedy(path, p, N_NEW)] for p in batch]


def mapped_file(t: torch.Tensor) -> str | None:
    """The file whose mapping holds tensor t's memory (/proc/self/maps), None for anonymous memory."""
    address = t.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(v, 16) for v in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else None
    return None


def test_weights_are_the_mapped_file(written, monkeypatch):
    """Unpermuted, unfused weights (o_proj, down_proj, lm_head) are the file's own mapped pages;
    fused (gate/up) and permuted (q/k) ones a copy; the weights held are the file's bytes."""
    with_reference(monkeypatch)
    path = written["Q8_0"]
    llm = LLM(path, num_kv_blocks=8)
    forms = linears(llm)
    for name in ("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj", "lm_head"):
        assert mapped_file(forms[name].data) == os.path.realpath(path), name
    assert mapped_file(forms["model.layers.0.mlp.gate_up_proj"].data) != os.path.realpath(path)
    tensor_bytes = sum(t.n_bytes for t in GgufFile(path).tensors)
    assert tensor_bytes <= llm.stats().weights_bytes <= 1.02 * tensor_bytes


def test_every_format_is_covered():
    kinds = {t.kind for name in FILES for t in GgufFile(committed(name)).tensors}
    assert kinds - {"F32"} | set(WRITTEN) == set(ggml_reference.FORMATS)


@pytest.mark.parametrize("name", FILES)
def test_llama_cpp_quantized_files_equal_transformers(name, monkeypatch):
    """Files made by llama.cpp's own quantizer (K-quants, mixed formats per layer)."""
    path = committed(name)
    with_reference(monkeypatch)
    llm = LLM(path, num_kv_blocks=64)
    kinds = {k for w in linears(llm).values() for k in (w.formats())}
    assert kinds <= set(ggml_reference.FORMATS) and kinds, kinds
    batch = prompts(2, seed=6)
    assert token_ids(llm.generate(batch, greedy(N_NEW))) == [[hf_greedy(path, p, N_NEW)] for p in batch]


def test_mixed_formats_are_parts_and_same_formats_fuse(monkeypatch):
    with_reference(monkeypatch)
    forms = linears(LLM(committed("Q4_K_M"), num_kv_blocks=8))
    fused = [forms[f"model.layers.{i}.self_attn.qkv_proj"] for i in range(2)] + \
        [forms[f"model.layers.{i}.mlp.gate_up_proj"] for i in range(2)]
    assert any(isinstance(w, PartsWeight) for w in fused)
    for w in fused:
        if isinstance(w, PartsWeight):
            assert len({p.kind for p in w.parts}) > 1
        else:
            assert isinstance(w, GgmlWeight)


@pytest.fixture(scope="module")
def cpu_kernel(cpu_ext):
    assert hasattr(cpu_ext, "ggml_matmul"), "the CPU extension has no GGML kernel"
    return cpu_ext


@pytest.mark.parametrize("name", ["MIXED", "qwen2-Q4_K_M"])
def test_cpu_kernel_keeps_guarantees(cpu_kernel, written, name):
    path = written.get(name) or committed(name)
    llm = LLM(path, num_kv_blocks=256)
    assert all(w.kernel is not None for w in linears(llm).values() if isinstance(w, GgmlWeight))
    batch = prompts(12, seed=11)          # preempts in 10 blocks (as test_quant_engine.py)
    alone = token_ids([llm.generate([p], greedy(16))[0] for p in batch])
    assert token_ids(llm.generate(batch, greedy(16))) == alone             # batched, cold
    assert token_ids(llm.generate(batch, greedy(16))) == alone             # prefix hits
    small = LLM(path, num_kv_blocks=10)
    preempted = token_ids(small.generate(batch, greedy(16)))
    assert small.stats().num_preemptions > 0
    # A sequence preempted by recompute computes its generated positions again by prefill, which
    # rounds a few ulp otherwise than the decode steps did (attention over another split of the
    # positions, which the int8 activations can turn into a visible logprob step): its tokens
    # are those of the run alone up to a near-tie of that run, where one may flip.
    gaps = [[sorted(t.top.values())[-1] - sorted(t.top.values())[-2] for t in out.outputs[0].logprobs]
            for out in (llm.generate([p], greedy(16, logprobs=2))[0] for p in batch)]
    for want, got, gap in zip(alone, preempted, gaps):
        first = next((i for i, (a, b) in enumerate(zip(want[0], got[0])) if a != b), None)
        assert first is None or gap[first] < NEAR_TIE, (first, gap[first] if first is not None else None)
    assert sum(want == got for want, got in zip(alone, preempted)) >= len(batch) - 1
    compared = 0
    with pytest.MonkeyPatch.context() as mp:
        with_reference(mp)
        ref_llm = LLM(path, num_kv_blocks=64)
    for p, got in zip(batch[:4], alone[:4]):
        ref_ids = hf_greedy(path, p, N_NEW)
        compared += compare_where_margins_allow(ref_llm, llm, p, ref_ids, got[0], MARGIN)
    assert compared >= N_NEW, "the margin rule compared almost nothing"


@pytest.mark.parametrize("name", ["qwen2-Q4_K_M", "Q5_K_M"])
def test_the_interleaved_layout_changes_no_logprob(cpu_kernel, name):
    """Q4_K, Q5_K and Q6_K kept interleaved (x8) against the same file in GGUF's rows: the same
    tokens and logprobs, bit for bit."""
    path = committed(name)
    llm = LLM(path, num_kv_blocks=64)
    kinds = {w.kind for w in linears(llm).values() if getattr(w, "interleaved", False)}
    assert kinds == ({"Q4_K", "Q6_K"} if name.startswith("qwen2") else {"Q5_K", "Q6_K"}), kinds
    with pytest.MonkeyPatch.context() as mp:
        native = loader.cpu_native()
        mp.setattr(loader, "cpu_native", lambda: dataclasses.replace(native, x8_kinds=frozenset()))
        rows = LLM(path, num_kv_blocks=64)
    assert not any(getattr(w, "interleaved", False) for w in linears(rows).values())
    for p in prompts(3, seed=12):
        a, b = (m.generate([p], SamplingParams(max_tokens=8, temperature=0.0, logprobs=3))[0].outputs[0]
                for m in (llm, rows))
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
