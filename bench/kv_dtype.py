"""The KV cache in a smaller dtype, side by side in one run: float32, bfloat16 and int8 KV
(EngineConfig.kv_cache_dtype) on the same model, one conversation at ~2,000 tokens of context.

    python bench/kv_dtype.py [--model FILE.gguf] [--context 2000] [--new-tokens 32]

Per dtype: the KV bytes a token of context costs over every layer (K and V, int8's scales
included: runner/kv_cache.bytes_per_block), the tokens a 1 GiB KV budget holds, prefill tok/s,
and decode tok/s of the new tokens after the prompt (the C++ batch-1 loop where it is used);
and the machine's read bandwidth (decode at this context reads the whole KV cache once per
token, so a smaller cache reads less). Writes bench/results/kv-dtype-<time>.json, prints a table.
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
from machine import read_bandwidth  # noqa: E402
from workload import CONTEXT, TOPICS  # noqa: E402

THREADS = 2
DTYPES = ("float32", "bfloat16", "int8")


def long_prompt(tokenizer, context: int) -> list[int]:
    """`context` tokens of English notes (plain text, cut to length)."""
    parts: list[str] = []
    ids: list[int] = []
    while len(ids) < context:
        parts.append(f"Notes on {TOPICS[len(parts) % len(TOPICS)]}, part {len(parts) + 1}: {CONTEXT * 3}")
        ids = tokenizer(" ".join(parts)).input_ids
    return list(ids[:context])


def run(path: str, kv_cache_dtype: str, context: int, new_tokens: int) -> dict:
    """Prefill `context` tokens, then decode new_tokens greedily; time both."""
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
    return {"kv_cache_dtype": str(engine.kv_cache_dtype).removeprefix("torch."),
            "context": len(prompt) + count, "new_tokens": count,
            "kv_bytes_per_token": per_token,
            "tokens_per_gib": 2**30 // per_token,
            "prefill_tok_s": round(len(prompt) / (first - start), 1),
            "decode_tok_s": round((count - 1) / (end - first), 2),
            "batch1_loop": engine.runner.batch1 is not None,
            "weights": engine.stats().weights_format}


def table(result: dict) -> str:
    rows = ["| KV dtype | KV bytes / token | tokens per GiB | prefill tok/s | decode tok/s |",
            "|---|---:|---:|---:|---:|"]
    for r in result["runs"]:
        rows.append(f"| {r['kv_cache_dtype']} | {r['kv_bytes_per_token']:,} | {r['tokens_per_gib']:,} "
                    f"| {r['prefill_tok_s']} | {r['decode_tok_s']} |")
    return "\n".join(rows)


def main(argv=None) -> dict:
    from localpaged.runner.loader import bundled_gguf_path
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: the bundled SmolLM2)")
    ap.add_argument("--context", type=int, default=2000, help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    args = ap.parse_args(argv)
    path = args.model or bundled_gguf_path()
    before = read_bandwidth(THREADS)
    runs = [run(path, name, args.context, args.new_tokens) for name in args.dtypes.split(",")]
    result = {"model": os.path.basename(path), "threads": THREADS,
              "read_bandwidth_gb_s": {"before": round(before, 1),
                                      "after": round(read_bandwidth(THREADS), 1)},
              "load_average": os.getloadavg(), "runs": runs}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    out = os.path.join(HERE, "results", f"kv-dtype-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(table(result))
    print(f"read bandwidth {result['read_bandwidth_gb_s']} GB/s, load {result['load_average']}; {out}")
    return result


if __name__ == "__main__":
    main()
