"""kernels/cpu_norm.cpp: RMSNorm over float32 rows against transformers' formula (float32
rounding of the sum apart); a row's result is bitwise the same alone, in a batch and on any
thread count; models/llama.py's RMSNorm runs it once the loader has chosen it, and only then."""

import pytest
from helpers import tiny_models
import torch

from localpaged import LLM
from localpaged.kernels import cpu_extension
from localpaged.models.llama import RMSNorm


@pytest.fixture(scope="module")
def kernel(cpu_ext):
    return cpu_ext.rms_norm


def formula(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("shape", [(1, 576), (37, 64), (5, 100), (2, 3, 48)])
def test_equals_the_formula(kernel, shape):
    g = torch.Generator().manual_seed(len(shape) * 1000 + shape[-1])
    x, weight = torch.randn(*shape, generator=g) * 3, torch.randn(shape[-1], generator=g)
    got = kernel(x, weight, 1e-5)
    assert got.shape == x.shape
    assert (got - formula(x, weight, 1e-5)).abs().max().item() < 1e-5


def test_a_row_alone_in_a_batch_and_on_any_thread_count_is_bitwise_the_same(kernel):
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(200, 576, generator=g), torch.randn(576, generator=g)
    batched = kernel(x, weight, 1e-6)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernel(x, weight, 1e-6), batched)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.cat([kernel(x[i:i + 1], weight, 1e-6) for i in range(200)]), batched)


def test_the_module_runs_the_kernel_for_float32_only(kernel):
    norm = RMSNorm(64, 1e-6)
    g = torch.Generator().manual_seed(0)
    norm.weight.data.normal_(generator=g)
    x = torch.randn(3, 64, generator=g)
    composite, half = norm(x), norm(x.bfloat16())
    norm.kernel = kernel
    assert torch.equal(norm(x), kernel(x, norm.weight, 1e-6))
    assert (norm(x) - composite).abs().max().item() < 1e-5
    assert torch.equal(norm(x.bfloat16()), half)               # half precision: the formula


def test_the_loader_chooses_it_once_per_model(kernel, tiny_llama, monkeypatch):
    kernels = {m.kernel for m in LLM(tiny_llama, num_kv_blocks=16).engine.model.modules()
               if isinstance(m, RMSNorm)}
    assert kernels == {kernel}
    monkeypatch.setattr(cpu_extension.BUILD, "module_if_cached", lambda: None)   # not built yet
    kernels = {m.kernel for m in LLM(tiny_llama, num_kv_blocks=16).engine.model.modules()
               if isinstance(m, RMSNorm)}
    assert kernels == {None}


def test_qwen3_head_norms_run_it_too(kernel, tiny_root):
    llm = LLM(tiny_models.build("qwen3", tiny_root), num_kv_blocks=16)
    attn = llm.engine.model.model.layers[0].self_attn
    assert attn.q_norm.kernel is kernel and attn.k_norm.kernel is kernel
