"""Speculative decoding, side by side in one run: localpaged without and with n-gram speculation,
and llama.cpp (llama-cpp-python) without and with its prompt-lookup decoding, on the same GGUF
file and the same prompt token ids, greedy, one conversation at a time.

    PYTHONPATH=<llama-cpp-python's site> python bench/speculative.py [--model F.gguf] [--quick]

`--model inflated`: the 1B-class file of bench/inflated_model.py (SmolLM2's function at 1.5B
parameters' bytes, Q4_K_M), made once; a 1B-class model whose replies copy what a real model's do.

Workloads (chat-templated by the file's tokenizer):
  (a) code edit: a pasted 60-line function, "rename `total` to `running_sum`, add a docstring";
  (b) summary of a pasted page;
  (c) regenerate: a 200-token reply asked again; localpaged drafts from the first reply
      (SamplingParams.draft_sources, as the chat app passes a regenerate's sibling), llama.cpp
      can only look in the prompt;
  (d) a free-form story (little to copy: speculation must not cost much).
Figures: decode tokens/s (first token to last), tokens, drafted / accepted, and the machine's
read bandwidth (bench/machine.py), with our decode without speculation as a share of it (the
weight bytes a step reads; speculation verifies several tokens per read, so it may pass 100%).
Writes bench/results/speculative-<time>.json and prints a table.
--draft-model M adds speculation="draft" (n-grams first, the draft model M where they find
nothing); --quantization sets the target's weights in our runs (e.g. none: the bundled file's
weights in float32, a target ~5x the Q4_1 draft's bytes).
"""

from __future__ import annotations

import argparse
import os
import sys
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

THREADS = 2


def code_prompt() -> str:
    lines = ["def summarize_orders(orders, tax_rate, discounts):"]
    lines += ["    total = 0", "    count = 0", "    skipped = []"]
    for i in range(18):
        lines += [f"    if orders[{i}].status == 'open':",
                  f"        total += orders[{i}].amount * (1 + tax_rate) - discounts.get({i}, 0)",
                  "        count += 1"]
    lines += ["    average = total / count if count else 0",
              "    return {'total': total, 'count': count, 'average': average}"]
    return ("Here is a function:\n\n```python\n" + "\n".join(lines) + "\n```\n\nRename the variable "
            "`total` to `running_sum` and add a docstring. Reply with the whole function.")


def page_prompt() -> str:
    from workload import CONTEXT, TOPICS
    page = " ".join(f"Section {i + 1}, on {t}: " + CONTEXT * 2 for i, t in enumerate(TOPICS[:8]))
    return "Summarize this page in a few sentences, quoting its section titles:\n\n" + page


WORKLOADS = {
    "code edit": code_prompt,
    "summary": page_prompt,
    "regenerate": lambda: "Explain in detail how a CPU cache works, with examples.",
    "story": lambda: "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def ours(path: str, prompts: dict, max_tokens: int, speculation: str, quantization: str = "auto",
         draft_model: str | None = None) -> dict:
    from localpaged import LLM, SamplingParams
    torch.set_num_threads(THREADS)
    llm = LLM(path, device="cpu", speculation=speculation, num_kv_blocks=512,
              quantization=quantization, draft_model=draft_model)
    llm.generate([prompts["story"][:8]], SamplingParams(max_tokens=4, temperature=0.0))  # warm
    runner = llm.engine.runner
    if getattr(runner, "batch1", None) is not None and hasattr(runner.batch1, "wait"):
        runner.batch1.wait()
    first_reply: list[int] = []
    out = {"weight_bytes_per_token": weight_bytes_per_token(llm)}
    for name, ids in prompts.items():
        llm.reset_prefix_cache()
        sources = [first_reply] if name == "regenerate" and first_reply else []
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, draft_sources=sources)
        if name == "regenerate" and not first_reply:     # the reply a regenerate stands beside
            first_reply = list(llm.generate([ids], params)[0].outputs[0].token_ids)
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                    draft_sources=[first_reply])
        res = llm.generate([ids], params)[0]
        c, m = res.outputs[0], res.metrics
        steps = len(c.token_ids) - 1
        out[name] = {"tokens": len(c.token_ids), "tok_s": round(steps / (m.finished_time - m.first_token_time), 2),
                     "drafted": c.draft_tokens, "accepted": c.accepted_draft_tokens,
                     "head": c.token_ids[:8]}
        print(f"  ours ({speculation}) {name}: {out[name]}", flush=True)
    return out


def llama_cpp(path: str, prompts: dict, max_tokens: int, lookup: bool) -> dict:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    draft = LlamaPromptLookupDecoding(num_pred_tokens=4) if lookup else None
    # logits_all with a draft model: llama-cpp-python 0.3.36 sizes its score buffer by the
    # argument, not by the draft model (which needs every position's logits)
    llm = Llama(path, n_ctx=4096, n_threads=THREADS, verbose=False, draft_model=draft,
                logits_all=lookup)
    out = {}
    for name, ids in prompts.items():
        llm.reset()
        first, count, start = None, 0, time.perf_counter()
        for _ in llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0, stream=True):
            count += 1
            first = first or time.perf_counter()
        end = time.perf_counter()
        out[name] = {"tokens": count, "tok_s": round((count - 1) / (end - first), 2) if count > 1 else None,
                     "prefill_s": round(first - start, 2)}
        print(f"  llama.cpp ({'prompt lookup' if lookup else 'plain'}) {name}: {out[name]}", flush=True)
    return out


def token_prompts(path: str) -> dict:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    return {name: list(tok.apply_chat_template([{"role": "user", "content": make()}],
                                               add_generation_prompt=True, tokenize=True,
                                               return_dict=False))
            for name, make in WORKLOADS.items()}


def table(result: dict) -> str:
    engines = [k for k in ("ours off", "ours ngram", "ours draft", "llama.cpp", "llama.cpp lookup")
               if k in result]
    draft = "ours draft" in result
    rows = ["| workload | " + " | ".join(engines) + " | ngram / off | ngram / lookup |"
            + (" draft / off | draft drafts |" if draft else "")
            + " off: share of read bandwidth |",
            "|---|" + "---:|" * (len(engines) + 3 + 2 * draft)]
    weights = result["ours off"]["weight_bytes_per_token"]
    for name in WORKLOADS:
        vals = [result[e][name]["tok_s"] for e in engines]
        off, on = result["ours off"][name]["tok_s"], result["ours ngram"][name]["tok_s"]
        lookup = result.get("llama.cpp lookup", {}).get(name, {}).get("tok_s")
        acc = result["ours ngram"][name]
        rows.append(f"| {name} ({acc['accepted']}/{acc['drafted']} drafts) | "
                    + " | ".join(str(v) for v in vals)
                    + f" | {on / off:.2f}x | " + (f"{on / lookup:.2f}x" if lookup else "-") + " |"
                    + (_draft_cells(result["ours draft"][name], off) if draft else "")
                    + f" {decode_share(off, weights, result['read_bandwidth']) or 0:.1%} |")
    return "\n".join(rows)


def _draft_cells(run: dict, off: float) -> str:
    return f" {run['tok_s'] / off:.2f}x | {run['accepted']}/{run['drafted']} |"


def main(argv=None) -> dict:
    from localpaged.runner.model_source import bundled_gguf_path
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: the bundled SmolLM2), or "
                    "inflated (bench/inflated_model.py)")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="64 tokens per workload")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--quantization", default="auto", help="the target's weights in our runs")
    ap.add_argument("--draft-model", default=None,
                    help="also run speculation=draft with this model (same tokenizer)")
    args = ap.parse_args(argv)
    if args.model == "inflated":
        import inflated_model
        args.model = str(inflated_model.ensure())
    path = args.model or bundled_gguf_path()
    max_tokens = 64 if args.quick else args.max_tokens
    prompts = token_prompts(path)
    result = {"model": path, "max_tokens": max_tokens, "threads": THREADS,
              "prompt_tokens": {k: len(v) for k, v in prompts.items()},
              "read_bandwidth": read_bandwidth(THREADS)}
    print(f"model {path}, read bandwidth {describe(result['read_bandwidth'])}", flush=True)
    result["quantization"], result["draft_model"] = args.quantization, args.draft_model
    result["ours off"] = ours(path, prompts, max_tokens, "off", args.quantization)
    result["ours ngram"] = ours(path, prompts, max_tokens, "ngram", args.quantization)
    if args.draft_model:
        result["ours draft"] = ours(path, prompts, max_tokens, "draft", args.quantization,
                                    args.draft_model)
    if not args.no_llama_cpp:
        try:
            result["llama.cpp"] = llama_cpp(path, prompts, max_tokens, lookup=False)
            result["llama.cpp lookup"] = llama_cpp(path, prompts, max_tokens, lookup=True)
        except ImportError as exc:
            print(f"llama.cpp skipped: {exc}", flush=True)
    result["table"] = table(result)
    print(result["table"])
    write_results("speculative", result)
    return result


if __name__ == "__main__":
    main()
