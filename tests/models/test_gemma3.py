"""Gemma 3's text model (models/gemma3.py) against transformers' Gemma3ForCausalLM on tiny random
models (tests/helpers/tiny_models.py GEMMA_CONFIGS: 6 layers, five of them with a 16-token sliding
window and one of full attention, GQA or MQA, head_dim 32/64, tied or untied, with or without
final logit softcapping).

Prompts are 48-80 tokens, three to five windows, so each sliding layer's window moves over
prefill and decode. Every engine path gives transformers' tokens: one prompt alone, batches,
block sizes, chunked prefill, prefix hits (the same prompt again, a shared prefix), preemption
by recompute and by swap, n-gram speculation, seeded samples with n > 1; prompt logprobs equal transformers' to
float rounding. A GGUF written from a tiny model's weights (llama.cpp's gemma3 names, norms
stored as w + 1) loads to the same tokens.
"""

from __future__ import annotations

import os

import pytest
from helpers import gemma3_gguf, tiny_models
import torch
from helpers.engine_helpers import greedy, hf_expected, hf_greedy, hf_model, prompts, token_ids

from localpaged import LLM, SamplingParams
from localpaged.models import Gemma3ForCausalLM
from localpaged.quant.ggml import GgmlWeight
from localpaged.quant.linear import QuantLinear

N_NEW = 16
WINDOW = tiny_models.GEMMA_COMMON["sliding_window"]


@pytest.fixture(scope="module")
def gemma(tiny_root):
    return tiny_models.build("gemma3", tiny_root)


@pytest.fixture(scope="module")
def batch():
    return prompts(4, seed=3, lo=3 * WINDOW, hi=5 * WINDOW)


@pytest.fixture(scope="module")
def alone(gemma, batch):
    """Each prompt run on its own, greedy; every row equals transformers' generate."""
    llm = LLM(gemma, block_size=16, num_kv_blocks=64, enable_prefix_caching=False)
    assert isinstance(llm.engine.model, Gemma3ForCausalLM)
    assert llm.engine.runner.batch1 is None             # the C++ batch-1 loop is Llama's
    outs = token_ids([llm.generate([p], greedy(N_NEW))[0] for p in batch])
    assert outs == [[hf_greedy(gemma, p, N_NEW)] for p in batch]
    return outs


def sampled(seed: int, n: int = 1) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.9, top_p=0.95, top_k=50, seed=seed,
                          max_tokens=N_NEW, ignore_eos=True)


@pytest.mark.parametrize("kind", ["gemma3-softcap"])      # "gemma3": the `alone` runs below
def test_batch_equals_transformers(kind, tiny_root):
    path = tiny_models.build(kind, tiny_root)
    llm = LLM(path, block_size=8, num_kv_blocks=128)
    batch = prompts(3, seed=len(kind), lo=3 * WINDOW, hi=5 * WINDOW)
    outs = llm.generate(batch, greedy(N_NEW))
    assert token_ids(outs) == [[hf_greedy(path, p, N_NEW)] for p in batch]
    assert llm.stats().blocks_in_use == 0


@pytest.mark.parametrize("kind", ["gemma3", "gemma3-softcap"])
def test_prompt_logprobs_equal_transformers(kind, tiny_root):
    """Every position's logprob of the next prompt token, over a prompt of five windows: the
    embedding scale, norms, both rope bases, the window and softcapping, position by position."""
    path = tiny_models.build(kind, tiny_root)
    prompt = prompts(1, seed=11, lo=5 * WINDOW, hi=5 * WINDOW + 1)[0]
    llm = LLM(path, block_size=16, num_kv_blocks=32)
    out = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    ours = torch.tensor([e.logprob for e in out.prompt_logprobs[1:]])
    with torch.inference_mode():
        logits = hf_model(path)(torch.tensor([prompt])).logits[0, :-1].double()
    theirs = torch.log_softmax(logits, -1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert torch.allclose(ours.double(), theirs, atol=1e-4), (ours - theirs).abs().max()


def test_batched_with_block_size_8(gemma, batch, alone):
    llm = LLM(gemma, block_size=8, num_kv_blocks=256)
    assert token_ids(llm.generate(batch, greedy(N_NEW))) == alone


def test_chunked_prefill(gemma, batch, alone):
    llm = LLM(gemma, block_size=16, num_kv_blocks=128, max_num_batched_tokens=7,
              debug_checks=True)
    assert token_ids(llm.generate(batch, greedy(N_NEW))) == alone


def test_prefix_hits(gemma, batch, alone):
    """The same prompt again, then a prompt sharing its first 40 tokens (past two windows)."""
    llm = LLM(gemma, block_size=16, num_kv_blocks=128, debug_checks=True)
    first = token_ids(llm.generate([batch[0]], greedy(N_NEW)))
    hits = llm.stats().prefix_cache_hits
    again = token_ids(llm.generate([batch[0]], greedy(N_NEW)))
    assert first == again == alone[:1]
    assert llm.stats().prefix_cache_hits > hits
    shared = batch[0][:40] + batch[1][1:20]
    hits = llm.stats().prefix_cache_hits
    out = token_ids(llm.generate([shared], greedy(N_NEW)))
    assert out == [[hf_greedy(gemma, shared, N_NEW)]]
    assert llm.stats().prefix_cache_hits > hits


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption(gemma, batch, alone, mode):
    llm = LLM(gemma, block_size=16, num_kv_blocks=10, preemption_mode=mode,
              swap_space_gb=0.001, debug_checks=True)
    assert token_ids(llm.generate(batch, greedy(N_NEW))) == alone
    stats = llm.stats()
    assert stats.num_preemptions > 0
    if mode == "swap":
        assert stats.num_swapped_out > 0
    assert stats.blocks_in_use == 0 and stats.cpu_blocks_in_use == 0


def test_speculation(gemma, batch, alone):
    """n-gram drafts verified in one forward (decode rows over each group's window): the same
    tokens as plain decoding; these repetitive random continuations accept drafts."""
    llm = LLM(gemma, block_size=16, num_kv_blocks=128, speculation="ngram", debug_checks=True)
    assert token_ids(llm.generate(batch, greedy(N_NEW))) == alone
    stats = llm.stats()
    assert 0 < stats.accepted_draft_tokens <= stats.draft_tokens


def test_seeded_samples(gemma, batch):
    """n = 3 seeded samples of one prompt beside a one-sample request: sample i is transformers'
    draw with sample i's random numbers (engine_helpers.hf_sampled), whatever runs beside it."""
    llm = LLM(gemma, block_size=16, num_kv_blocks=128)
    three, one = llm.generate(batch[:2], [sampled(5, n=3), sampled(6)])
    assert [c.token_ids for c in three.outputs] == hf_expected(gemma, batch[0], sampled(5, n=3))
    assert [c.token_ids for c in one.outputs] == hf_expected(gemma, batch[1], sampled(6))


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_stays_close(gemma, quantization):
    """int8/int4 weights through the quantized linears: every projection quantized, the
    perplexity of a prompt within 10% of the float model's (these random weights are sharp)."""
    from localpaged.runner.prompt_logprobs import perplexity
    prompt = prompts(1, seed=12, lo=4 * WINDOW, hi=4 * WINDOW + 1)[0]
    base = perplexity(LLM(gemma, block_size=16, num_kv_blocks=32), prompt)
    llm = LLM(gemma, block_size=16, num_kv_blocks=32, quantization=quantization)
    layer = llm.engine.model.model.layers[0]
    assert all(isinstance(m, QuantLinear) for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                   layer.mlp.gate_up_proj, layer.mlp.down_proj))
    assert abs(perplexity(llm, prompt) / base - 1) < 0.10


# ---- GGUF -------------------------------------------------------------------------------------
def write_gemma_gguf(hf_path: str, path: str, tensor_type: str = "F32") -> str:
    """The HF model's weights as llama.cpp's converter writes a Gemma 3 (helpers/gemma3_gguf.py),
    2-D weights in `tensor_type`, with the byte-level tokenizer of tests/helpers/ggml_models.py."""
    from helpers import ggml_models
    model = hf_model(hf_path)
    tokens, types, ids = ggml_models.vocabulary()
    merges = [f"{a} {b}" for a, b in ggml_models.MERGES]
    return gemma3_gguf.write_text(path, model.config, model.state_dict(), (tokens, types, merges),
                                  (ids["bos"], ids["eos"]), tensor_type=tensor_type)


@pytest.fixture(scope="module")
def gemma_gguf(tiny_root):
    hf = tiny_models.build("gemma3-gguf", tiny_root)
    return hf, write_gemma_gguf(hf, os.path.join(tiny_root, "tiny-gemma3-F32.gguf"))


def test_gguf_round_trip_equals_transformers(gemma_gguf, batch):
    hf, path = gemma_gguf
    llm = LLM(path, block_size=16, num_kv_blocks=128)
    config = llm.engine.model_config
    assert config.model_type == "gemma3_text" and config.layer_types == hf_model(hf).config.layer_types
    assert config.query_pre_attn_scalar == config.head_dim      # llama.cpp's scale for the file
    assert token_ids(llm.generate(batch[:3], greedy(N_NEW))) == \
        [[hf_greedy(hf, p, N_NEW)] for p in batch[:3]]


def test_gguf_q8_0_kept_in_its_blocks(gemma_gguf, tiny_root, cpu_ext):
    """A Q8_0 file's matrices stay in their GGML blocks on the CPU kernel; its perplexity is
    within 2% of the F32 file's."""
    from localpaged.runner.prompt_logprobs import perplexity
    hf, f32 = gemma_gguf
    q8 = write_gemma_gguf(hf, os.path.join(tiny_root, "tiny-gemma3-Q8_0.gguf"), "Q8_0")
    prompt = prompts(1, seed=13, lo=4 * WINDOW, hi=4 * WINDOW + 1)[0]
    llm = LLM(q8, block_size=16, num_kv_blocks=32)
    linear = llm.engine.model.model.layers[0].mlp.down_proj
    assert isinstance(linear, QuantLinear) and isinstance(linear.packed, GgmlWeight)
    base = perplexity(LLM(f32, block_size=16, num_kv_blocks=32), prompt)
    assert abs(perplexity(llm, prompt) / base - 1) < 0.02


# ---- what is refused, what maps where (no engine) --------------------------------------------
def test_refused_by_name():
    from transformers import Gemma3TextConfig

    from localpaged.models import build_model
    from localpaged.runner.model_check import check_config
    config = tiny_models.GEMMA_CONFIGS["gemma3"]()
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        with torch.device("meta"):
            build_model(Gemma3TextConfig(**{**config.to_dict(), "attn_logit_softcapping": 50.0}))
    with pytest.raises(ValueError, match="query_pre_attn_scalar must be a finite number > 0"):
        check_config({**config.to_dict(), "query_pre_attn_scalar": 0}, "config.json")
    bad_rope = {**config.rope_parameters, "sliding_attention": {"rope_type": "default", "rope_theta": -1.0}}
    with pytest.raises(ValueError, match="rope_parameters.sliding_attention.rope_theta"):
        check_config({**config.to_dict(), "rope_parameters": bad_rope}, "config.json")


def test_gguf_names_by_family(gemma):
    """llama.cpp's ffn_norm is Llama's post-attention norm but Gemma 3's pre-feedforward one;
    every weight of a Gemma 3 but the tied lm_head has a GGUF name that maps back to it."""
    from localpaged.quant.gguf import hf_name
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("blk.3.ffn_norm.weight", "gemma3_text") == \
        "model.layers.3.pre_feedforward_layernorm.weight"
    assert hf_name("blk.3.post_attention_norm.weight", "gemma3_text") == \
        "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("blk.3.post_ffw_norm.weight", "gemma3_text") == \
        "model.layers.3.post_feedforward_layernorm.weight"
    assert all(hf_name(gemma3_gguf.gguf_name(n), "gemma3_text") == n
               for n in hf_model(gemma).state_dict()
               if n != "lm_head.weight")
