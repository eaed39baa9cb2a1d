"""Tiny random vision-language models (Idefics3, SmolVLM) with their processor, saved in a temp
dir, and seeded random images: for engine-vs-transformers tests of prompts with images.

The tokenizer has one token per printable ASCII character plus the processor's special tokens
(<image>, <fake_token_around_image>, <global-img>, <row_i_col_j>, <end_of_utterance>); the
vision tower sees 32x32 crops in 8x8 patches (16 patches, 4 image tokens per crop after the
pixel shuffle); images up to 64 pixels are split into a grid of up to 2x2 crops plus the
global view. SmolVLM's processor needs torchvision (its video processor), so the SmolVLM model
is saved with its weights and config only (its tower is compared on pixels directly).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForImageTextToText, AutoProcessor, Idefics3Config, Idefics3ForConditionalGeneration,
                          Idefics3ImageProcessorPil, Idefics3Processor, PreTrainedTokenizerFast,
                          SmolVLMConfig, SmolVLMForConditionalGeneration)

SPECIAL = (["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
           + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])
VOCAB = 160                # 3 control ids, 95 printable characters, the 40 specials, room
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% else %}<image>"
    "{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              image_size=32, patch_size=8)
TEXT = dict(model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {"idefics3": (Idefics3Config, Idefics3ForConditionalGeneration),
            "smolvlm": (SmolVLMConfig, SmolVLMForConditionalGeneration)}


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"<{i}>": i for i in range(3)}
    vocab.update({chr(c): c - 29 for c in range(32, 127)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<1>", eos_token="<2>",
                                   pad_token="<0>", unk_token="<0>")
    fast.add_special_tokens({"additional_special_tokens": SPECIAL})
    return fast


def build(root: str, family: str = "idefics3", seed: int = 0) -> str:
    """A random model of `family` saved to root/tiny-<family> (once); returns the path."""
    path = os.path.join(root, f"tiny-{family}")
    if os.path.isdir(path):
        return path
    tok = tokenizer()
    config_class, model_class = FAMILIES[family]
    config = config_class(vision_config=VISION, text_config=TEXT, scale_factor=2,
                          image_token_id=tok.convert_tokens_to_ids("<image>"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
        for p in model.parameters():          # sharper than the default init: images matter
            p.data.normal_(0, 0.08)
    model.save_pretrained(path)
    if family == "idefics3":
        image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 64},
                                                    max_image_size={"longest_edge": 32})
        Idefics3Processor(image_processor, tok, image_seq_len=4,
                          chat_template=CHAT_TEMPLATE).save_pretrained(path)
    else:
        tok.save_pretrained(path)
    return path


def image(seed: int, height: int = 40, width: int = 70) -> Image.Image:
    """A random RGB image from `seed`."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@functools.lru_cache(maxsize=4)
def hf_model(path: str):
    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


@functools.lru_cache(maxsize=2)
def hf_processor(path: str):
    return AutoProcessor.from_pretrained(path)


def hf_inputs(path: str, text: str, images: list) -> dict:
    """transformers' processor output for text with image markers (ids, pixels, masks)."""
    return dict(hf_processor(path)(text=[text], images=[images] if images else None,
                                   return_tensors="pt"))


def hf_greedy(path: str, inputs: dict, max_new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of `inputs` (EOS ignored) and each chosen token's
    logprob (log_softmax of the float32 logits)."""
    with torch.inference_mode():
        out = hf_model(path).generate(**inputs, max_new_tokens=max_new_tokens,
                                      min_new_tokens=max_new_tokens, do_sample=False,
                                      eos_token_id=None, pad_token_id=0, output_scores=True,
                                      return_dict_in_generate=True)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, tokens)]
    return tokens, logprobs
