"""A reply branched at one of its tokens: what the branch's first new token costs with the prefix
cache (it holds everything before the chosen token: whole blocks, and a copy of the block the
branch leaves the reply in) against the same request on an empty cache (a prefill of it all).

On the bundled SmolLM2 (its GGUF, the project's CPU kernels): a chat prompt, a greedy reply of
--reply tokens, then the prompt + the reply's first --at tokens + the second likeliest token at
--at, greedy for --tokens more. Each side --rounds times on one engine, taking turns (the cache
side first fills the cache with the reply; the empty side resets the prefix cache first). Reports
the tokens the branch's first step computed, its time to first token (median) and that both
sides write the same tokens. Writes bench/results/token_branch-<time>.json.

    python bench/token_branch.py [--reply 300] [--at 150] [--tokens 32] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.machine import cpu_flags, cpu_model, write_results  # noqa: E402


def first_step(llm, prompt: list[int], tokens: int) -> dict:
    """Run one greedy request step by step: the tokens its first step computed, the time to
    its first token, its tokens."""
    from localpaged import SamplingParams
    eng = llm.engine
    before = eng.num_tokens_computed
    start = time.perf_counter()
    eng.add_request("branch", prompt, SamplingParams(temperature=0.0, max_tokens=tokens,
                                                     ignore_eos=True, speculative=False))
    outs = eng.step()
    while not (outs and outs[0].outputs[0].token_ids):
        outs = eng.step()
    ttft = time.perf_counter() - start
    computed = eng.num_tokens_computed - before
    while eng.has_unfinished_requests():
        outs = eng.step()
    out = outs[0]
    return {"ttft_s": ttft, "first_step_tokens": computed,
            "cached_tokens": out.metrics.num_cached_tokens, "token_ids": out.outputs[0].token_ids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reply", type=int, default=300)
    ap.add_argument("--at", type=int, default=150)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from localpaged import LLM, SamplingParams
    from localpaged.runner.model_source import bundled_gguf_path
    llm = LLM(bundled_gguf_path())
    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper who "
                 "finds a message in a bottle, with many details."}]
    prompt = llm.apply_chat_template(messages)
    params = SamplingParams(temperature=0.0, max_tokens=args.reply, ignore_eos=True, logprobs=2,
                            speculative=False)
    first = llm.generate([prompt], params)[0].outputs[0]
    top = first.logprobs[args.at].top
    alt = next(t for t in sorted(top, key=lambda t: -top[t]) if t != first.token_ids[args.at])
    branch = prompt + list(first.token_ids[:args.at]) + [alt]
    runs = {"cached": [], "empty": []}
    for r in range(args.rounds):
        for side in (("cached", "empty") if r % 2 == 0 else ("empty", "cached")):
            if side == "empty":
                llm.engine.block_manager.reset_prefix_cache()
            else:
                llm.generate([prompt], params)            # the reply's blocks cached again
            runs[side].append(first_step(llm, branch, args.tokens))
    result = {"machine": {"cpu": cpu_model(), "features": cpu_flags(), "threads": args.threads,
                          "torch": torch.__version__},
              "command": " ".join(["python", "bench/token_branch.py"] + sys.argv[1:]),
              "prompt_tokens": len(prompt), "branch_prompt_tokens": len(branch)}
    for side, rs in runs.items():
        result[side] = {"ttft_ms_median": statistics.median(r["ttft_s"] for r in rs) * 1e3,
                        "ttft_ms_each": [round(r["ttft_s"] * 1e3, 1) for r in rs],
                        "first_step_tokens": [r["first_step_tokens"] for r in rs],
                        "cached_tokens": [r["cached_tokens"] for r in rs]}
    same = all(r["token_ids"] == runs["empty"][0]["token_ids"] for rs in runs.values() for r in rs)
    result["same_tokens"] = same
    c, e = result["cached"], result["empty"]
    print(f"machine: {result['machine']}")
    print(f"branch at token {args.at} of a {args.reply}-token reply: a {len(branch)}-token prompt")
    print("| cache | first step computes | cached tokens | time to first token (median) |\n"
          "|---|---:|---:|---:|")
    for name, r in (("holds the reply", c), ("empty", e)):
        print(f"| {name} | {r['first_step_tokens'][0]} | {r['cached_tokens'][0]} | "
              f"{r['ttft_ms_median']:.1f} ms |")
    print(f"same tokens: {same}; ratio {e['ttft_ms_median'] / c['ttft_ms_median']:.1f}x")
    write_results("token_branch", result)


if __name__ == "__main__":
    main()
