"""A tiny reasoning model that never stops thinking on its own: the tiny Llama's shape and
tokenizer, with `<think>` and `</think>` as added tokens of its vocabulary (as Qwen3's, decoded
back to their text), a chat template that opens `<think>` in its generation prompt (and closes it
at once with enable_thinking=false, as Qwen3's does), and weights that can never write
`</think>` (nor `<think>`, EOS or the turn markers) however they are sampled.

How the weights forbid a token: hidden dimension 0 of the residual stream is a constant C for
every token (the embeddings' column 0 is C; every layer's output projections write nothing
there), so after the final RMSNorm h[0] is C / rms(x) > 0 at every position. The forbidden
tokens' lm_head rows read only that dimension, with a large negative weight, and no other row
reads it: their logits are always far below every other token's, on every code path that
computes logits (no hook to bypass).
"""

from __future__ import annotations

import os

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from helpers.engine_helpers import hf_greedy
from helpers.tiny_models import COMMON, VOCAB

THINK, END_THINK, NEWLINE, IM_START, IM_END, UNK = 500, 501, 502, 503, 504, 505
ADDED = {THINK: "<think>", END_THINK: "</think>", NEWLINE: "\n", IM_START: "<|im_start|>",
         IM_END: "<|im_end|>", UNK: "<unk>"}
FORBIDDEN = (THINK, END_THINK, IM_START, IM_END, 2)      # 2: EOS
FORCED = [END_THINK, NEWLINE, NEWLINE]      # what a spent budget appends: marker, transition

CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' %}{{ m.content.split('</think>')[-1].lstrip() }}"
    "{%- else %}{{ m.content }}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- else %}<think>\n{%- endif %}{%- endif %}")

# In-vocabulary text (the tokenizer knows U+0100..U+01FF one character a token).
QUESTION = "".join(chr(0x100 + (i * 7) % 256) for i in range(10))


def _tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"<{i}>": i for i in range(3)}
    vocab.update({chr(0x100 + i) if i < 256 else f"<x{i}>": i + 3 for i in range(VOCAB - 3)})
    for tid, text in ADDED.items():
        del vocab[next(k for k, v in vocab.items() if v == tid)]
        vocab[text] = tid
    # ASCII (the template's role names) is unknown: not the pad id, which transformers'
    # generate would mask out of the prompt
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.add_tokens([AddedToken(ADDED[t], special=False, normalized=False)
                    for t in (THINK, END_THINK, NEWLINE)])
    tok.add_special_tokens([AddedToken(ADDED[t], special=True, normalized=False)
                            for t in (IM_START, IM_END)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<1>", eos_token="<2>",
                                   pad_token="<0>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_thinker(root: str, seed: int = 0) -> str:
    """Save (once) the never-closing reasoning model to root; returns its path."""
    path = os.path.join(root, "tiny-thinker")
    if os.path.isdir(path):
        return path
    config = LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **COMMON)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        for p in model.parameters():
            p.data.normal_(0, 0.08)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 2.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.model.norm.weight.fill_(1.0)
        head = model.lm_head.weight
        head.mul_(8.0)                  # logits far apart: greedy has no near-ties
        head[:, 0] = 0.0
        for t in FORBIDDEN:
            head[t, :] = 0.0
            head[t, 0] = -50.0
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path


def hf_budgeted(path: str, prompt: list[int], budget: int, total: int) -> list[int]:
    """A greedy reply under a thinking budget, from transformers: the model's own first `budget`
    reasoning tokens, the forced closing marker and transition, then its greedy continuation."""
    head = (hf_greedy(path, prompt, budget) if budget else []) + FORCED
    return head + hf_greedy(path, prompt + head, total - len(head))
