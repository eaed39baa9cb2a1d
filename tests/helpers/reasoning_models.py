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

`build_harmony_thinker` is the same model with a harmony tokenizer (OpenAI's GPT-OSS format:
`<|channel|>`, `<|message|>`, `<|end|>`, `<|start|>` special tokens, `analysis`, `final` and
`assistant` tokens of their own) and a harmony-style template whose generation prompt opens
the analysis channel; the forbidden tokens are the four structural ones and EOS, so it never
leaves the analysis channel on its own.
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


# harmony: the four structural tokens are special (the detokenizer drops them unless kept)
H_CHANNEL, H_MESSAGE, H_END, H_START, H_ANALYSIS, H_FINAL, H_ASSISTANT, H_UNK = range(500, 508)
HARMONY_SPECIAL = {H_CHANNEL: "<|channel|>", H_MESSAGE: "<|message|>", H_END: "<|end|>",
                   H_START: "<|start|>"}
HARMONY_PLAIN = {H_ANALYSIS: "analysis", H_FINAL: "final", H_ASSISTANT: "assistant"}
HARMONY_FORBIDDEN = (*HARMONY_SPECIAL, 2)
HARMONY_FORCED = [H_END, H_START, H_ASSISTANT, H_CHANNEL, H_FINAL, H_MESSAGE]
HARMONY_TEMPLATE = (
    "{%- for m in messages %}<|start|>{{ m.role }}"
    "{%- if m.role == 'assistant' %}<|channel|>final{%- endif %}<|message|>{{ m.content }}<|end|>"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant<|channel|>analysis<|message|>{%- endif %}")


def _tokenizer(plain: dict[int, str], special: dict[int, str], unk: int,
               template: str) -> PreTrainedTokenizerFast:
    """One character a token (U+0100..U+01FF), the ids of `plain` and `special` given to those
    texts as added tokens (plain ones decoded back to their text, special ones dropped by
    skip_special_tokens), `<unk>` at id unk."""
    added = {**plain, **special, unk: "<unk>"}
    vocab = {f"<{i}>": i for i in range(3)}
    vocab.update({chr(0x100 + i) if i < 256 else f"<x{i}>": i + 3 for i in range(VOCAB - 3)})
    for tid, text in added.items():
        del vocab[next(k for k, v in vocab.items() if v == tid)]
        vocab[text] = tid
    # ASCII (the template's role names) is unknown: not the pad id, which transformers'
    # generate would mask out of the prompt
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain.values()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in special.values()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<1>", eos_token="<2>",
                                   pad_token="<0>", unk_token="<unk>")
    fast.chat_template = template
    return fast


def _build(path: str, tokenizer: PreTrainedTokenizerFast, forbidden: tuple[int, ...],
           seed: int) -> str:
    """Save (once) the tiny Llama that never writes `forbidden` to path; returns path."""
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
        for t in forbidden:
            head[t, :] = 0.0
            head[t, 0] = -50.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_thinker(root: str, seed: int = 0) -> str:
    """Save (once) the never-closing reasoning model to root; returns its path."""
    plain = {t: ADDED[t] for t in (THINK, END_THINK, NEWLINE)}
    special = {t: ADDED[t] for t in (IM_START, IM_END)}
    return _build(os.path.join(root, "tiny-thinker"),
                  _tokenizer(plain, special, UNK, CHAT_TEMPLATE), FORBIDDEN, seed)


def build_harmony_thinker(root: str, seed: int = 0) -> str:
    """Save (once) the never-closing harmony model to root; returns its path."""
    return _build(os.path.join(root, "tiny-harmony"),
                  _tokenizer(HARMONY_PLAIN, HARMONY_SPECIAL, H_UNK, HARMONY_TEMPLATE),
                  HARMONY_FORBIDDEN, seed)


def hf_budgeted(path: str, prompt: list[int], budget: int, total: int,
                forced: list[int] = FORCED) -> list[int]:
    """A greedy reply under a thinking budget, from transformers: the model's own first `budget`
    reasoning tokens, the forced closing marker and transition, then its greedy continuation."""
    head = (hf_greedy(path, prompt, budget) if budget else []) + forced
    return head + hf_greedy(path, prompt + head, total - len(head))
