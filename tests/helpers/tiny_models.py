"""Tiny random Hugging Face models built in a temp dir, for engine-vs-transformers tests."""

from __future__ import annotations

import os

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen3Config)

VOCAB = 512

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0)

CONFIGS = {
    "llama-gqa": lambda: LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **COMMON),
    "llama-mqa-tied": lambda: LlamaConfig(num_attention_heads=4, num_key_value_heads=1,
                                          tie_word_embeddings=True, **COMMON),
    "qwen2-bias": lambda: Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **COMMON),
    "qwen3": lambda: Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                 tie_word_embeddings=False, **COMMON),
    "mistral": lambda: MistralConfig(num_attention_heads=4, num_key_value_heads=2,
                                     sliding_window=None, **COMMON),
    "llama3-rope": lambda: LlamaConfig(
        num_attention_heads=4, num_key_value_heads=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 256}, **COMMON),
}


# Gemma 3 text models (models/gemma3.py): 6 layers, so that the default pattern gives five
# sliding-window layers and one full-attention layer; a window of 16 tokens (prompts of 3x that
# cross it); query_pre_attn_scalar unlike head_dim, so a wrong attention scale shows.
GEMMA_COMMON = dict(COMMON, num_hidden_layers=6, sliding_window=16)
GEMMA_CONFIGS = {
    "gemma3": lambda: Gemma3TextConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                       query_pre_attn_scalar=24, **GEMMA_COMMON),
    # the attention scale llama.cpp gives a GGUF Gemma 3 (1/sqrt(head_dim)): for a GGUF round trip
    "gemma3-gguf": lambda: Gemma3TextConfig(num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=32, query_pre_attn_scalar=32, **GEMMA_COMMON),
    # untied lm_head, final logit softcapping, MQA, head_dim 64, its own layer pattern
    "gemma3-softcap": lambda: Gemma3TextConfig(
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, query_pre_attn_scalar=64,
        tie_word_embeddings=False, final_logit_softcapping=3.0,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention"], **GEMMA_COMMON),
}


# Sliding-window models in the Llama family (tests/core/test_sliding_blocks.py): Qwen2 with layer 0
# full and layers 1-2 sliding (transformers: layer i slides when i >= max_window_layers), and a
# Mistral whose every layer slides; windows of 20 and 24 tokens, not multiples of a block.
# Drawn sharper (SLIDING_INIT_STD) so that attention is far from uniform and what a window keeps
# out changes the logits (at the default scale it moves them by under 0.01).
SLIDING_INIT_STD = 0.25
SLIDING_COMMON = dict(COMMON, num_hidden_layers=3)
SLIDING_CONFIGS = {
    "qwen2-sliding": lambda: Qwen2Config(num_attention_heads=4, num_key_value_heads=2,
                                         use_sliding_window=True, max_window_layers=1,
                                         sliding_window=20, **SLIDING_COMMON),
    "mistral-sliding": lambda: MistralConfig(num_attention_heads=4, num_key_value_heads=2,
                                             sliding_window=24, **SLIDING_COMMON),
    # a window of 512 over 4,096 positions: a 4,000-token conversation crosses it many times
    "qwen2-window512": lambda: Qwen2Config(num_attention_heads=4, num_key_value_heads=2,
                                           use_sliding_window=True, max_window_layers=1,
                                           sliding_window=512,
                                           **dict(SLIDING_COMMON, max_position_embeddings=4096)),
}


def _tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer whose vocabulary is VOCAB ids (unused ids decode to nothing)."""
    vocab = {f"<{i}>": i for i in range(3)}
    vocab.update({chr(0x100 + i) if i < 256 else f"<x{i}>": i + 3 for i in range(VOCAB - 3)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<1>", eos_token="<2>",
                                   pad_token="<0>", unk_token="<0>")


def build(kind: str, root: str, seed: int = 0) -> str:
    """Save a random model of the given kind (see CONFIGS, GEMMA_CONFIGS, SLIDING_CONFIGS) to root/kind; returns
    the path. Its weights follow from `seed` alone: drawn from the global RNG seeded inside
    fork_rng, which leaves the global RNG as it was (the values every test was written against)."""
    path = os.path.join(root, kind)
    if os.path.isdir(path):
        return path
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = (CONFIGS.get(kind) or GEMMA_CONFIGS.get(kind) or SLIDING_CONFIGS[kind])()
        model = AutoModelForCausalLM.from_config(config)
        std = SLIDING_INIT_STD if kind in SLIDING_CONFIGS else 0.08
        for p in model.parameters():             # a sharper distribution than the default init
            p.data.normal_(0, std)
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path
