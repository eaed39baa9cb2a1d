"""What "auto" means on a GPU, checked without one: each rule is called with a CUDA device (and
torch.cuda's answers monkeypatched), beside its CPU answer. The dtype (bf16 where the GPU has it,
else fp16), the attention backend (the Triton kernels), background work sharing the interactive
steps, one prepared alternative after a reply, and the KV cache sized from the GPU's free
memory. The CUDA-graph runner has its own fake-CUDA tests (test_defaults.py)."""

from types import SimpleNamespace

import pytest
import torch

from localpaged.core.config import background_shares_batch
from localpaged.models.attention import get_backend
from localpaged.runner import kv_cache
from localpaged.runner.loader import resolve_dtype
from localpaged.ui.prepared import logic as prepared

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize("bf16", [True, False])
def test_dtype(monkeypatch, bf16):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert resolve_dtype("auto", CUDA) == (torch.bfloat16 if bf16 else torch.float16)
    assert resolve_dtype("auto", CPU) == torch.float32
    assert resolve_dtype("float16", CUDA) == torch.float16
    with pytest.raises(ValueError, match="float16 is not supported on CPU"):
        resolve_dtype("float16", CPU)


def test_attention_backend():
    assert get_backend("auto", CUDA).name == "triton"
    assert get_backend("auto", CPU).name == "cpu"
    with pytest.raises(ValueError, match="runs on CPU, not cuda"):
        get_backend("cpu", CUDA)


def test_background_batching():
    assert background_shares_batch("auto", "cuda") and not background_shares_batch("auto", "cpu")
    assert background_shares_batch("share", "cpu") and not background_shares_batch("idle", "cuda")
    with pytest.raises(ValueError, match="background_batch must be one of"):
        background_shares_batch("sometimes", "cuda")


def test_prepared_alternatives(monkeypatch):
    monkeypatch.setattr(prepared, "is_local", lambda backend: backend.local)
    on = lambda device, local=True: SimpleNamespace(   # noqa: E731
        local=local, engine=SimpleNamespace(info=SimpleNamespace(device=device)))
    assert prepared.default_alternatives(on("cuda")) == 1
    assert prepared.default_alternatives(on("cpu")) == 0
    assert prepared.default_alternatives(on("cuda", local=False)) == 0   # a remote backend


def test_kv_memory_is_the_gpu_s_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (7 << 30, 80 << 30))
    assert kv_cache.available_memory(CUDA) == 7 << 30
    assert 0 < kv_cache.available_memory(CPU) != 7 << 30
