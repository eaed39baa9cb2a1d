"""Sliding-window KV at a long context, side by side in one run: localpaged and llama.cpp
(llama-cpp-python) on the same Gemma 3 270M GGUF (the suite's second real model: 5 of every 6
layers attend over a 512-token window), one conversation, greedy.

    PYTHONPATH=<llama-cpp-python's site> python bench/sliding_window.py [--context 4000]

Per engine: the KV bytes a token of context costs at the end of the run (ours: the blocks the
sequence holds, from EngineStats; llama.cpp: its KV buffers as it logs them, with its SWA cache
trimmed to the window (`swa_full=False`) and full-size (`swa_full=True`, llama-cpp-python's
default)), prefill tokens/s, and decode tokens/s of the last new tokens at that context; and
the machine's read bandwidth (bench/machine.py), with each decode as a share of it (a step reads
the weights, as ours holds them, and the KV held at that context). Writes
bench/results/sliding-window-<time>.json, prints a table.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import (  # noqa: E402
    decode_share,
    describe,
    read_bandwidth,
    weight_bytes_per_token,
    write_results,
)
from workload import CONTEXT, TOPICS  # noqa: E402

THREADS = 2


def long_prompt(tokenizer, context: int) -> list[int]:
    """About `context` tokens of English notes on every topic, then a request to summarize:
    chat-templated where the file has a template (the Gemma 3 270M base model has none)."""
    parts, ids = [], []
    while len(ids) < context:
        parts.append(f"Notes on {TOPICS[len(parts) % len(TOPICS)]}, part {len(parts) + 1}: {CONTEXT * 3}")
        text = " ".join(parts) + "\n\nSummarize these notes."
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                add_generation_prompt=True, tokenize=True,
                                                return_dict=False)
        else:
            ids = tokenizer(text).input_ids
    return list(ids)


def ours(path: str, prompt: list[int], new_tokens: int, kv_cache_dtype: str) -> dict:
    """Prefill, then decode; the KV held is read from EngineStats at the last step."""
    from localpaged import LLM, SamplingParams
    torch.set_num_threads(THREADS)
    llm = LLM(path, device="cpu", max_model_len=len(prompt) + new_tokens + 16,
              kv_cache_dtype=kv_cache_dtype)
    engine = llm.engine
    engine.add_request("bench", prompt, SamplingParams(max_tokens=new_tokens, temperature=0.0,
                                                       ignore_eos=True))
    start = time.perf_counter()
    first = held = None
    count = 0
    while engine.has_unfinished_requests():
        stats = engine.stats()
        outs = engine.step()
        for out in outs:
            count = len(out.outputs[0].token_ids)
        if count and first is None:
            first = time.perf_counter()
        if engine.has_unfinished_requests():
            held = stats
    end = time.perf_counter()
    context = len(prompt) + count
    return {"context": context, "new_tokens": count,
            "prefill_tok_s": round(len(prompt) / (first - start), 1),
            "decode_tok_s": round((count - 1) / (end - first), 2),
            "kv_bytes_per_token": round(kv_bytes_held(engine, held) / context),
            "kv_bytes_per_token_no_window": sum(engine.kv_plan.bytes_per_block) // engine.config.block_size,
            "kv_dtype": str(engine.kv_cache_dtype), "weights": engine.stats().weights_format,
            "weight_bytes_per_token": weight_bytes_per_token(llm)}


def kv_bytes_held(engine, stats) -> int:
    """Bytes of the KV blocks held in every layer at the stats' step: each KV-cache group's
    blocks in use times its bytes per block (engine.kv_plan: every layer of the group, in the
    KV cache's dtype)."""
    per_block = engine.kv_plan.bytes_per_block
    if not stats.kv_groups:
        return stats.blocks_in_use * per_block[0]
    return sum(g.blocks_in_use * b for g, b in zip(stats.kv_groups, per_block))


def llama_cpp(path: str, prompt: list[int], new_tokens: int, swa_full: bool) -> dict:
    from llama_cpp import Llama
    log = tempfile.TemporaryFile(mode="w+")
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)                   # its KV sizes are logged by llama.cpp itself
    try:
        llm = Llama(path, n_ctx=len(prompt) + new_tokens + 16, n_threads=THREADS,
                    swa_full=swa_full, verbose=True)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    kv_bytes = sum(float(m) * (1 << 20) for m in
                   re.findall(r"llama_kv_cache: size =\s*([\d.]+) MiB", log.read()))
    first, count, start = None, 0, time.perf_counter()
    for _ in llm.create_completion(prompt, max_tokens=new_tokens, temperature=0.0, stream=True):
        count += 1
        first = first or time.perf_counter()
    end = time.perf_counter()
    context = len(prompt) + count
    return {"context": context, "new_tokens": count,
            "prefill_tok_s": round(len(prompt) / (first - start), 1),
            "decode_tok_s": round((count - 1) / (end - first), 2),
            "kv_bytes_per_token": round(kv_bytes / context),
            "kv_cache_mib": round(kv_bytes / (1 << 20), 1)}


def table(result: dict) -> str:
    rows = ["| engine | KV bytes / token | prefill tok/s | decode tok/s | decode: share of read "
            "bandwidth |", "|---|---:|---:|---:|---:|"]
    weights = next((r["weight_bytes_per_token"] for r in result["engines"].values()
                    if "weight_bytes_per_token" in r), 0)
    for name, r in result["engines"].items():
        read = weights + r["kv_bytes_per_token"] * r["context"] if weights else 0
        share = decode_share(r["decode_tok_s"], read, result["read_bandwidth"])
        rows.append(f"| {name} | {r['kv_bytes_per_token']:,} | {r['prefill_tok_s']} | "
                    f"{r['decode_tok_s']} | {'-' if share is None else f'{share:.1%}'} |")
    return "\n".join(rows)


def main(argv=None) -> dict:
    from localpaged.runner import gguf_meta
    from localpaged.runner.model_source import bundled_gemma3_path
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: the Gemma 3 270M file)")
    ap.add_argument("--context", type=int, default=4000, help="prompt tokens (about)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--kv-cache-dtype", default="auto,int8",
                    help="ours with each of these KV cache dtypes (comma-separated)")
    ap.add_argument("--no-llama-cpp", action="store_true")
    args = ap.parse_args(argv)
    path = args.model or bundled_gemma3_path()
    # the file's tokenizer, as the loader builds it (runner/gguf_meta.py)
    _config, tok = gguf_meta.config_and_tokenizer(os.path.dirname(path), os.path.basename(path))
    prompt = long_prompt(tok, args.context)
    result = {"model": path, "prompt_tokens": len(prompt), "threads": THREADS,
              "read_bandwidth": read_bandwidth(THREADS), "engines": {}}
    print(f"prompt {len(prompt)} tokens, read bandwidth {describe(result['read_bandwidth'])}",
          flush=True)
    for kv_dtype in args.kv_cache_dtype.split(","):
        name = f"localpaged (KV {kv_dtype})"
        result["engines"][name] = ours(path, prompt, args.new_tokens, kv_dtype)
        print(name, result["engines"][name], flush=True)
    if not args.no_llama_cpp:
        for swa_full in (False, True):
            name = f"llama.cpp (swa_full={swa_full})"
            result["engines"][name] = llama_cpp(path, prompt, args.new_tokens, swa_full)
            print(name, result["engines"][name], flush=True)
    print(table(result))
    write_results("sliding-window", result)
    return result


if __name__ == "__main__":
    main()
