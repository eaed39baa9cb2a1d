"""Peers measured on the same model and workload: transformers (three ways) and llama.cpp."""

from __future__ import annotations

import os
import time

import torch


def load_hf(gguf: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                 dtype=dtype)
    return model.eval()


def _gen_kwargs(n: int, max_tokens: int, beams: int = 1) -> dict:
    kw = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=0)
    if beams > 1:
        return dict(kw, num_beams=beams, do_sample=False, num_return_sequences=1)
    return dict(kw, do_sample=True, temperature=0.8, top_p=0.95, num_return_sequences=n)


@torch.inference_mode()
def hf_one_at_a_time(model, prompts: list[list[int]], n: int, max_tokens: int, beams: int = 1) -> dict:
    start, tokens = time.perf_counter(), 0
    for p in prompts:
        out = model.generate(torch.tensor([p]), **_gen_kwargs(n, max_tokens, beams))
        tokens += (out.shape[1] - len(p)) * out.shape[0]
    return _result(tokens, start)


@torch.inference_mode()
def hf_padded_batch(model, prompts: list[list[int]], n: int, max_tokens: int, beams: int = 1,
                    batch_size: int = 16) -> dict:
    start, tokens, reserved = time.perf_counter(), 0, 0
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk])        # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(input_ids=ids, attention_mask=mask, **_gen_kwargs(n, max_tokens, beams))
        tokens += (out.shape[1] - width) * (out.shape[0] // max(1, beams if beams > 1 else 1))
        reserved += out.shape[0] * (width + max_tokens) * (beams if beams > 1 else 1)
    return dict(_result(tokens, start), kv_slots_reserved=reserved)


def hf_continuous_batching(gguf: str, dtype: torch.dtype, prompts: list[list[int]], n: int,
                           max_tokens: int) -> dict:
    from transformers import AutoModelForCausalLM, GenerationConfig
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                 dtype=dtype, attn_implementation="paged|sdpa").eval()
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=True, temperature=0.8, top_p=0.95,
                              num_return_sequences=n, eos_token_id=-1, pad_token_id=0)
    start = time.perf_counter()
    with torch.inference_mode():
        results = model.generate_batch(prompts, generation_config=config, warmup=False)
    tokens = sum(len(r.generated_tokens) for r in results.values())
    return _result(tokens, start)


def llama_cpp_one_at_a_time(gguf: str, prompts: list[list[int]], n: int, max_tokens: int) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(gguf, n_ctx=2048, n_threads=os.cpu_count(), verbose=False)
    start, tokens = time.perf_counter(), 0
    for p in prompts:
        for _ in range(n):
            llm.reset()
            for i, _tok in enumerate(llm.generate(p, temp=0.8, top_p=0.95)):
                if i + 1 >= max_tokens:
                    break
            tokens += max_tokens
    return _result(tokens, start)


def _result(tokens: int, start: float) -> dict:
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 2)}
