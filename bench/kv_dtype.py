"""The KV cache in a smaller dtype, side by side in one run: float32, bfloat16 and int8 KV
(EngineConfig.kv_cache_dtype) on the same model, one conversation at ~2,000 tokens of context.

    python bench/kv_dtype.py [--model FILE.gguf] [--context 2000] [--new-tokens 32]

Per dtype: the KV bytes a token of context costs over every layer (K and V, int8's scales
included: runner/kv_cache.bytes_per_block), the tokens a 1 GiB KV budget holds, prefill tok/s,
and decode tok/s of the new tokens after the prompt (the C++ batch-1 loop where it is used);
and the machine's read bandwidth (bench/machine.py), with decode as a share of it (a step reads
the weights and the whole KV cache at this context, so a smaller cache reads less). Then the
decode attention alone: the `cpu` backend's kernel (kernels/cpu_decode.cpp) over every layer of
the model at that context, the best of
REPEATS calls (robust on a loaded machine, where one step's time is mostly waiting for a core).
Then the K/V write alone through the torch path (the Python layer loop's; int8 quantizes
there). `--no-engine` runs only those two. Writes bench/results/kv-dtype-<time>.json, prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import decode_share, describe, read_bandwidth, weight_bytes_per_token  # noqa: E402
from workload import CONTEXT, TOPICS  # noqa: E402

THREADS = 2
DTYPES = ("float32", "bfloat16", "int8")
REPEATS = 30


def long_prompt(tokenizer, context: int) -> list[int]:
    """`context` tokens of English notes (plain text, cut to length)."""
    parts: list[str] = []
    ids: list[int] = []
    while len(ids) < context:
        parts.append(f"Notes on {TOPICS[len(parts) % len(TOPICS)]}, part {len(parts) + 1}: {CONTEXT * 3}")
        ids = tokenizer(" ".join(parts)).input_ids
    return list(ids[:context])


def run(path: str, kv_cache_dtype: str, context: int, new_tokens: int, bw: dict) -> dict:
    """Prefill `context` tokens, then decode new_tokens greedily; time both; decode as a share of
    the read bandwidth `bw` (bytes a step reads: the weights, and the KV of the context)."""
    from localpaged import LLM, SamplingParams
    torch.set_num_threads(THREADS)
    llm = LLM(path, device="cpu", kv_cache_dtype=kv_cache_dtype,
              max_model_len=context + new_tokens + 16, max_num_batched_tokens=2048)
    engine = llm.engine
    if engine.runner.batch1 is not None:
        engine.runner.batch1.wait(900)               # the C++ loop, as a chat would use it
    prompt = long_prompt(llm.tokenizer, context)
    engine.add_request("bench", prompt, SamplingParams(max_tokens=new_tokens, temperature=0.0,
                                                       ignore_eos=True))
    start = time.perf_counter()
    first, count = None, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            count = len(out.outputs[0].token_ids)
        if count and first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    plan, block_size = engine.kv_plan, engine.config.block_size
    per_token = plan.bytes_per_block[0] // block_size
    decode = round((count - 1) / (end - first), 2)
    read = weight_bytes_per_token(llm) + per_token * (len(prompt) + count // 2)
    return {"kv_cache_dtype": str(engine.kv_cache_dtype).removeprefix("torch."),
            "context": len(prompt) + count, "new_tokens": count,
            "kv_bytes_per_token": per_token,
            "tokens_per_gib": 2**30 // per_token,
            "prefill_tok_s": round(len(prompt) / (first - start), 1),
            "decode_tok_s": decode, "read_bytes_per_token": read,
            "decode_share_of_bandwidth": decode_share(decode, read, bw),
            "batch1_loop": engine.runner.batch1 is not None,
            "weights": engine.stats().weights_format}


def attention_alone(config: dict, kv_cache_dtype: str, context: int, threads: int) -> dict:
    """Best-of-REPEATS time of one decode step's attention over every layer (one sequence of
    `context` tokens, blocks in order), with the KV cache in this dtype."""
    from localpaged.kernels import cpu_extension, kv_quant
    torch.set_num_threads(threads)
    dtype, module = kv_quant.NAMES[kv_cache_dtype], cpu_extension.BUILD.module
    layers, heads, kv_heads, dim = (config[k] for k in ("layers", "heads", "kv_heads", "head_dim"))
    blocks = -(-context // 16)
    caches = [[kv_quant.store(torch.randn(blocks, 16, kv_heads, dim), dtype) for _ in range(2)]
              for _ in range(layers)]
    q = torch.randn(1, heads, dim)
    table = torch.arange(blocks, dtype=torch.int32)[None]
    lens = torch.tensor([context], dtype=torch.int32)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for k, v in caches:
            module.paged_decode_attention(q, k, v, table, lens, dim ** -0.5)
        best = min(best, time.perf_counter() - start)
    return {"kv_cache_dtype": kv_cache_dtype, "threads": threads,
            "attention_ms_per_step": round(best * 1e3, 3),
            "kv_bytes_read_per_step": sum(c.numel() * c.element_size() for kv in caches for c in kv)}


def write_alone(config: dict, kv_cache_dtype: str) -> dict:
    """Best-of-REPEATS time of one decode step's K/V write over every layer through the torch
    path (kernels/reference.write_kv: what the Python layer loop runs, e.g. for Gemma 3), where
    an int8 cache quantizes each row; and the same with K and V quantized one at a time
    (kv_quant.store twice, where store_pair quantizes both in one pass) for comparison."""
    from localpaged.kernels import kv_quant, reference
    torch.set_num_threads(1)
    dtype = kv_quant.NAMES[kv_cache_dtype]
    layers, kv_heads, dim = (config[k] for k in ("layers", "kv_heads", "head_dim"))
    width = kv_quant.row_width(dim, dtype)
    caches = [[torch.zeros(64, 16, kv_heads, width, dtype=dtype) for _ in range(2)]
              for _ in range(layers)]
    key, value, slots = torch.randn(1, kv_heads, dim), torch.randn(1, kv_heads, dim), torch.tensor([37])

    def best(write) -> float:
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            for k, v in caches:
                write(k, v)
            times.append(time.perf_counter() - start)
        return round(min(times) * 1e3, 3)

    def one_at_a_time(k, v):
        k.view(-1, *k.shape[2:]).index_copy_(0, slots, kv_quant.store(key, dtype))
        v.view(-1, *v.shape[2:]).index_copy_(0, slots, kv_quant.store(value, dtype))

    return {"kv_cache_dtype": kv_cache_dtype,
            "write_ms_per_step": best(lambda k, v: reference.write_kv(key, value, k, v, slots)),
            "write_ms_per_step_k_then_v": best(one_at_a_time)}


def model_shape(path: str) -> dict:
    from localpaged import LLM
    engine = LLM(path, device="cpu", num_kv_blocks=1).engine
    mc = engine.model_config
    return {"layers": mc.num_hidden_layers, "heads": mc.num_attention_heads,
            "kv_heads": mc.num_key_value_heads, "head_dim": engine.model.head_dim}


def table(result: dict) -> str:
    rows = ["| KV dtype | KV bytes / token | tokens per GiB | prefill tok/s | decode tok/s "
            "| decode: share of read bandwidth |", "|---|---:|---:|---:|---:|---:|"]
    for r in result["runs"]:
        rows.append(f"| {r['kv_cache_dtype']} | {r['kv_bytes_per_token']:,} | {r['tokens_per_gib']:,} "
                    f"| {r['prefill_tok_s']} | {r['decode_tok_s']} "
                    f"| {r['decode_share_of_bandwidth']:.1%} |")
    rows += ["", "| KV dtype | threads | attention ms / step (all layers) | KV MB read / step |",
             "|---|---:|---:|---:|"]
    for r in result["attention"]:
        rows.append(f"| {r['kv_cache_dtype']} | {r['threads']} | {r['attention_ms_per_step']} "
                    f"| {r['kv_bytes_read_per_step'] / 1e6:.1f} |")
    rows += ["", "| KV dtype | K/V write ms / step, torch path (all layers) | K then V |",
             "|---|---:|---:|"]
    for r in result.get("writes", []):
        rows.append(f"| {r['kv_cache_dtype']} | {r['write_ms_per_step']} | "
                    f"{r['write_ms_per_step_k_then_v']} |")
    return "\n".join(rows)


def main(argv=None) -> dict:
    from localpaged.runner.model_source import bundled_gguf_path
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: the bundled SmolLM2)")
    ap.add_argument("--context", type=int, default=2000, help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--no-engine", action="store_true", help="only the attention kernel")
    args = ap.parse_args(argv)
    path = args.model or bundled_gguf_path()
    names = args.dtypes.split(",")
    before = read_bandwidth(THREADS)
    runs = [] if args.no_engine else [run(path, name, args.context, args.new_tokens, before)
                                      for name in names]
    from localpaged.kernels import cpu_extension
    cpu_extension.BUILD.wait(900)
    shape = model_shape(path)
    attention = [attention_alone(shape, name, args.context, threads)
                 for threads in (1, THREADS) for name in names]
    writes = [write_alone(shape, name) for name in names]
    result = {"model": os.path.basename(path), "threads": THREADS, "shape": shape,
              "context": args.context, "attention": attention, "writes": writes,
              "read_bandwidth": {"before": before, "after": read_bandwidth(THREADS)},
              "load_average": os.getloadavg(), "runs": runs}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    out = os.path.join(HERE, "results", f"kv-dtype-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(table(result))
    bw = result["read_bandwidth"]
    print(f"read bandwidth before: {describe(bw['before'])}; after: {describe(bw['after'])}; "
          f"load {result['load_average']}; {out}")
    return result


if __name__ == "__main__":
    main()
