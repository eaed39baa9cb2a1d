"""models.linear.Linear: the one-row product split over CPU threads equals F.linear bitwise, is
taken where it is exact, falls back everywhere else; and a whole conversation decoded one at a
time through it still equals transformers. Plus the block pool's back-to-back allocation, which
lets the batch-1 decode read a conversation's K/V in place."""

import pytest
import torch
import torch.nn.functional as F
from helpers.engine_helpers import greedy, hf_greedy, prompts

from localpaged import LLM
from localpaged.models import linear

SMOLLM2_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]   # N, K


@pytest.fixture
def threads():
    """Run a test at a given torch thread count, restored afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture
def split_calls(monkeypatch):
    """Count the products that took the split path."""
    calls = []
    real = linear.times_blocks

    def spy(x, blocks, bias):
        calls.append((blocks.shape[0] * blocks.shape[2], blocks.shape[1]))     # (N, K)
        return real(x, blocks, bias)
    monkeypatch.setattr(linear, "times_blocks", spy)
    return calls


def _layer(n: int, k: int, bias: bool, seed: int = 0) -> linear.Linear:
    g = torch.Generator().manual_seed(seed)
    layer = linear.Linear(k, n, bias=bias)
    layer.weight.data.normal_(0, 0.05, generator=g)
    if bias:
        layer.bias.data.uniform_(-0.1, 0.1, generator=g)
    return layer


@pytest.mark.parametrize("shape", SMOLLM2_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_one_row_at_model_widths_is_split_and_bitwise_equal(shape, bias, threads, split_calls):
    threads(2)
    layer = _layer(*shape, bias)
    x = torch.randn(1, shape[1], generator=torch.Generator().manual_seed(1))
    layer(x)                                    # the first call checks the split on this weight
    split_calls.clear()
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert split_calls == [shape]               # the threaded path really ran


@pytest.mark.parametrize("case", ["one thread", "several rows", "rows not divisible", "bfloat16"])
def test_other_products_go_to_f_linear(case, threads, split_calls):
    threads(1 if case == "one thread" else 2)
    layer = _layer(575 if case == "rows not divisible" else 576, 64, bias=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3 if case == "several rows" else 1, 64, generator=g)
    if case == "bfloat16":
        layer, x = layer.to(torch.bfloat16), x.to(torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert split_calls == []


def test_inexact_split_is_checked_once_and_not_used(threads, split_calls, monkeypatch):
    threads(2)
    checks = []
    monkeypatch.setattr(linear, "split_is_exact", lambda *a: checks.append(a) or False)
    layer = _layer(64, 32, bias=False)
    x = torch.randn(1, 32, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert len(checks) == 1 and split_calls == []


def test_a_replaced_weight_is_checked_again(threads, monkeypatch):
    threads(2)
    checks = []
    real = linear.split_is_exact
    monkeypatch.setattr(linear, "split_is_exact", lambda *a: checks.append(a) or real(*a))
    layer, g = _layer(64, 32, bias=False), torch.Generator().manual_seed(1)
    layer(torch.randn(1, 32, generator=g))
    layer.weight = torch.nn.Parameter(torch.randn(64, 32, generator=g))   # as loading or tying do
    x = torch.randn(1, 32, generator=g)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert len(checks) == 2


def test_one_conversation_at_a_time_equals_transformers(tiny_llama, threads, split_calls):
    """The chat case: one sequence decoding alone, every matmul through the split path."""
    threads(2)
    llm = LLM(tiny_llama, num_kv_blocks=32)
    for prompt in prompts(3, seed=11):
        assert llm.generate([prompt], greedy(24))[0].outputs[0].token_ids == hf_greedy(tiny_llama, prompt, 24)
    assert split_calls                       # the decode steps took the threaded path
