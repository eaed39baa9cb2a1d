"""Quantized weights keep the engine's guarantees (DESIGN.md §1) on a tiny random Llama.

Batching, prefix hits and preemption change no greedy token with int8 or int4 weights. Greedy
int8 equals fp32 up to their first difference, which must fall at a step where fp32's own top-2
logit margin is below MARGIN (tests/helpers/quant_helpers.py: margin_rule): int8
weights (per-channel, error <= scale/2) and bf16 activations move a tiny model's logits by a few
thousandths (measured max |delta| ~0.0025, asserted < MARGIN / 2), so a closer race may legitimately flip.
"""

import pytest
from helpers.engine_helpers import greedy, prompts, token_ids
from helpers.quant_helpers import compare_where_margins_allow

from localpaged import LLM

N_NEW = 16
MARGIN = 0.01         # logits (tiny-model logits are ~0.25 at most; measured int8 deviation ~0.0025)
QUANTS = ["int8", "int4"]


@pytest.fixture(scope="module")
def batch():
    return prompts(12, seed=11)    # batched decode runs M > CPU_INT8_PACKED_MAX_M


@pytest.fixture(scope="module", params=QUANTS)
def quant_alone(request, tiny_llama, batch):
    q = request.param
    llm = LLM(tiny_llama, num_kv_blocks=64, enable_prefix_caching=False, quantization=q)
    return q, token_ids([llm.generate([p], greedy(N_NEW))[0] for p in batch])


def test_batching_prefix_hits_and_preemption(tiny_llama, batch, quant_alone):
    q, alone = quant_alone
    llm = LLM(tiny_llama, num_kv_blocks=256, quantization=q)
    assert token_ids(llm.generate(batch, greedy(N_NEW))) == alone          # one batch, cold
    hits = llm.stats().prefix_cache_hits
    assert token_ids(llm.generate(batch, greedy(N_NEW))) == alone          # prefix hits
    assert llm.stats().prefix_cache_hits > hits
    small = LLM(tiny_llama, num_kv_blocks=10, quantization=q)
    assert token_ids(small.generate(batch, greedy(N_NEW))) == alone
    assert small.stats().num_preemptions > 0
    stats = llm.stats()
    assert stats.weights_format.startswith("int8 ·" if q == "int8" else "int4 g32 ·")


def test_weights_are_smaller(tiny_llama):
    fp = LLM(tiny_llama, num_kv_blocks=8).stats()
    i8 = LLM(tiny_llama, num_kv_blocks=8, quantization="int8").stats()
    i4 = LLM(tiny_llama, num_kv_blocks=8, quantization="int4").stats()
    assert fp.weights_format.startswith("float32 ·")
    assert i4.weights_bytes < i8.weights_bytes < fp.weights_bytes / 3


def test_greedy_int8_equals_fp32_where_margins_allow(tiny_llama, batch):
    fp = LLM(tiny_llama, num_kv_blocks=64)
    i8 = LLM(tiny_llama, num_kv_blocks=64, quantization="int8")
    compared = 0
    for p in batch:
        ref = fp.generate([p], greedy(N_NEW))[0].outputs[0].token_ids
        got = i8.generate([p], greedy(N_NEW))[0].outputs[0].token_ids
        compared += compare_where_margins_allow(fp, i8, p, ref, got, MARGIN)
    assert compared >= len(batch) * 8        # generated tokens compared: half, at least


def test_bad_quantization_is_a_clear_error(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="quantization must be one of 'auto', 'none', 'int8', 'int4', got 'int3'"):
        LLM(tiny_llama, quantization="int3")
    from helpers import tiny_models
    from transformers import AutoModelForCausalLM, LlamaConfig
    config = LlamaConfig(num_attention_heads=4, num_key_value_heads=2,
                         **(tiny_models.COMMON | {"hidden_size": 48, "intermediate_size": 96}))
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "odd")
    tiny_models._tokenizer().save_pretrained(tmp_path / "odd")
    with pytest.raises(ValueError, match=r"quantization='int4' needs in_features divisible by the "
                                         r"group size 32.*Use quantization='int8'"):
        LLM(str(tmp_path / "odd"), quantization="int4", num_kv_blocks=8)
    odd8 = LLM(str(tmp_path / "odd"), quantization="int8", num_kv_blocks=8)   # int8 has no groups
    assert odd8.stats().weights_format.startswith("int8")


@pytest.mark.parametrize("kind", ["llama-mqa-tied", "qwen2-bias"])
def test_tied_and_biased_models(tiny_root, kind):
    from helpers import tiny_models
    llm = LLM(tiny_models.build(kind, tiny_root), num_kv_blocks=64, quantization="int4")
    model = llm.engine.model
    if kind == "llama-mqa-tied":                 # one packed table for embeddings and lm_head
        assert model.lm_head.packed is model.model.embed_tokens.packed
    batch = prompts(6, seed=3)
    alone = token_ids([llm.generate([p], greedy(8))[0] for p in batch])
    assert token_ids(llm.generate(batch, greedy(8))) == alone
