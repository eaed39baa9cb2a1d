"""Throughput and KV memory: localpaged next to its peers, same model, same workload, one run.

    python bench/throughput.py            # the full workload (16 chats, 128 new tokens)
    python bench/throughput.py --quick    # a smaller one for a smoke run

Prints a table of tokens/s and ratios (ours / peer), the KV memory holding tokens versus what
was reserved (ours, and a contiguous max-length cache), and the blocks saved by sharing next to
the paper's figures; writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import peers  # noqa: E402
import workload  # noqa: E402

from localpaged import LLM, SamplingParams  # noqa: E402
from localpaged.core.request import BeamParams  # noqa: E402
from localpaged.engine import step_decisions
from localpaged.runner import loader, model_source

PAPER = {"parallel_sampling_saving": "6.1-30.5%", "beam_saving": "37.6-66.3%",
         "kv_utilization_paged": ">96%", "kv_utilization_contiguous": "20.4-38.2%"}


def run_ours(llm: LLM, prompts, n: int, max_tokens: int, beams: int = 1) -> dict:
    """Run the workload through the engine step by step, sampling block stats as it goes."""
    engine = llm.engine
    params = SamplingParams(n=n, temperature=0.8, top_p=0.95, seed=0, max_tokens=max_tokens,
                            ignore_eos=True) if beams == 1 else \
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    groups = [engine.make_group(p, params, beam=BeamParams(beams) if beams > 1 else None)
              for p in prompts]
    llm.reset_prefix_cache()                 # every workload starts cold: no hits from a previous run
    start = time.perf_counter()
    for g in groups:
        engine.add_group(g)
    peak = {"held": 0, "unshared": 0, "tokens": 0, "slots": 0}
    while engine.has_unfinished_requests():
        engine.step()
        s = engine.stats()
        if s.blocks_in_use > peak["held"]:
            peak = {"held": s.blocks_in_use, "unshared": s.blocks_without_sharing,
                    "tokens": s.tokens_in_use, "slots": s.blocks_in_use * s.block_size}
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for g in groups for c in step_decisions.request_output(g).outputs[:1 if beams > 1 else None])
    return {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 2),
            "peak_blocks_held": peak["held"], "peak_blocks_without_sharing": peak["unshared"],
            "sharing_saving": round(1 - peak["held"] / max(1, peak["unshared"]), 4),
            "kv_utilization": round(peak["tokens"] / max(1, peak["slots"]), 4)}


def contiguous_utilization(prompts, n: int, max_tokens: int, max_model_len: int) -> float:
    """A cache that reserves max_model_len per sequence, at the end of the run (its best case)."""
    held = sum((len(p) + max_tokens) * n for p in prompts)
    return round(held / (len(prompts) * n * max_model_len), 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path (default: the bundled SmolLM2)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quantization", default="none", choices=["auto", "none", "int8", "int4"],
                    help="our weights (default none: float32, as the peers; auto keeps the GGUF's int4)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="8 requests, 32 new tokens")
    ap.add_argument("--skip", default="", help="comma list of peers to skip: one,padded,cb,llamacpp,beam")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.quick:
        args.requests, args.max_tokens = 8, 32
    skip = set(filter(None, args.skip.split(",")))
    gguf = args.model or model_source.bundled_gguf_path()
    dtype = loader.resolve_dtype(args.dtype, torch.device(args.device))
    llm = LLM(gguf, dtype=args.dtype, device=args.device, max_num_seqs=256, num_kv_blocks=4096,
              quantization=args.quantization)
    prompts = [llm.apply_chat_template(c) for c in workload.chats(args.requests)]
    hf = peers.load_hf(gguf, dtype)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))          # warm-up, both systems
    peers.hf_one_at_a_time(hf, prompts[:1], 1, 4)
    results: dict = {"config": vars(args), "prompt_lens": [len(p) for p in prompts], "paper": PAPER,
                     "machine": {"cpus": os.cpu_count(), "torch": torch.__version__}}
    for n in (1, 4):
        print(f"n={n}", flush=True)
        row = {}
        measure(row, "localpaged", lambda: run_ours(llm, prompts, n, args.max_tokens))
        if "one" not in skip:
            measure(row, "hf_one_at_a_time", lambda: peers.hf_one_at_a_time(hf, prompts, n, args.max_tokens))
        if "padded" not in skip:
            measure(row, "hf_padded_batch", lambda: peers.hf_padded_batch(hf, prompts, n, args.max_tokens))
        if "cb" not in skip:
            measure(row, "hf_continuous_batching",
                    lambda: peers.hf_continuous_batching(gguf, dtype, prompts, n, args.max_tokens))
        if "llamacpp" not in skip:
            measure(row, "llama_cpp_one_at_a_time",
                    lambda: peers.llama_cpp_one_at_a_time(gguf, prompts, n, args.max_tokens))
        row["contiguous_max_len_utilization"] = contiguous_utilization(
            prompts, n, args.max_tokens, llm.engine.max_model_len)
        results[f"n={n}"] = row
    if "beam" not in skip:
        row = {}
        measure(row, "localpaged", lambda: run_ours(llm, prompts, 1, args.max_tokens, beams=4))
        if "one" not in skip:
            measure(row, "hf_one_at_a_time",
                    lambda: peers.hf_one_at_a_time(hf, prompts, 1, args.max_tokens, beams=4))
        results["beam=4"] = row
    print_table(results)
    out = os.path.join(os.path.dirname(__file__), "results", f"throughput-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {out}")


def measure(row: dict, name: str, run) -> None:
    """Run one system on the workload, record and print its result at once."""
    row[name] = run()
    if row[name] is not None:
        print(f"  {name}: {row[name]['tokens_per_s']} tok/s", flush=True)


def print_table(results: dict) -> None:
    print(f"\n{'workload':<8} {'system':<26} {'tok/s':>8} {'ours/peer':>10}")
    for key in ("n=1", "n=4", "beam=4"):
        row = results.get(key)
        if not row:
            continue
        ours = row["localpaged"]["tokens_per_s"]
        for name, r in row.items():
            if isinstance(r, dict) and "tokens_per_s" in r:
                print(f"{key:<8} {name:<26} {r['tokens_per_s']:>8.1f} {ours / r['tokens_per_s']:>9.2f}x")
        o = row["localpaged"]
        print(f"{'':<8} KV slots holding tokens: ours {o['kv_utilization']:.1%}"
              + (f", contiguous max-length cache {row['contiguous_max_len_utilization']:.1%}"
                 if "contiguous_max_len_utilization" in row else "")
              + f"; blocks saved by sharing {o['sharing_saving']:.1%}")
    print(f"paper: parallel sampling saves {PAPER['parallel_sampling_saving']}, beam search "
          f"{PAPER['beam_saving']}; contiguous caches hold tokens in {PAPER['kv_utilization_contiguous']}")


if __name__ == "__main__":
    main()
