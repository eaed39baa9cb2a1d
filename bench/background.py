"""Background siblings versus interactive latency: does alternative work slow the reply you read?

    python bench/background.py            # 4 chat turns, 64 new tokens, 3 rounds
    python bench/background.py --quick    # 2 turns, 24 new tokens, 1 round (a smoke run)

One chat, several turns, on the bundled SmolLM2 GGUF (CPU by default). Each turn sends the
interactive reply, and with siblings on, at the same moment k alternatives of it (one request,
n = k, seeded sampling) at background priority, over the same prompt. Siblings either share the
interactive steps ("share": the leftover budget) or run only in steps without interactive work
("idle"); see EngineConfig.background_batch. Modes off / k=1,2 share / k=1,2 idle / off again
(an A/A control: its ratio to off is the noise of the run) run turn by turn, interleaved, with the prefix cache cleared before each turn, so they see the same
machine load and the same cache; the figure per mode is the median over rounds, then the mean
over turns. Measured for the interactive request only: time to first token (seconds and engine
steps) and decode tokens/s (tokens after the first, over the time after the first token). After
the interactive reply ends, the engine runs on until the siblings end (the user reading; not
timed). The interactive reply must be the same with siblings on as off (checked). "Batch tokens
per step" is the background's share of each batch (off: 1 per decode step, plus the prefill).

Prints a table with the ratios on / off (target: interactive within 10% of off) and writes JSON
to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time

import torch

from localpaged import LLM, SamplingParams
from localpaged.core.sampling_params import BACKGROUND
from localpaged.engine import step_decisions
from localpaged.runner import model_source

USER_TURNS = ["Hi! Can you explain how a CPU cache works?",
              "What is the difference between L1 and L2 caches?",
              "Why does the cache line size matter for performance?",
              "Give me a short summary of what we discussed."]


def run_turn(llm: LLM, prompt: list[int], mode: tuple[int, bool], max_tokens: int, seed: int) -> dict:
    """One interactive reply, with k background siblings sent at the same moment (k = 0: off);
    mode = (k, whether background work shares steps with interactive work)."""
    engine = llm.engine
    k, engine.scheduler.background_shares_batch = mode     # what EngineConfig.background_batch sets
    llm.reset_prefix_cache()
    params = SamplingParams(temperature=0.7, seed=seed, max_tokens=max_tokens, ignore_eos=True)
    group = engine.make_group(prompt, params)
    siblings = None
    if k:
        siblings = engine.make_group(prompt, SamplingParams(
            n=k, temperature=0.9, seed=seed + 1000, max_tokens=max_tokens, ignore_eos=True),
            priority=BACKGROUND)
    engine.add_group(group)
    if siblings:
        engine.add_group(siblings)
    steps, first_step, sibling_tokens_meanwhile = 0, None, 0
    tokens_before = engine.num_tokens_computed
    while not group.is_finished:
        engine.step()
        steps += 1
        if first_step is None and group.first_token_time is not None:
            first_step = steps
    batch_tokens = engine.num_tokens_computed - tokens_before
    if siblings:
        sibling_tokens_meanwhile = sum(s.num_output_tokens for s in siblings.seqs)
        while not siblings.is_finished:                  # the user reads; not timed
            engine.step()
    out = step_decisions.request_output(group)
    m = out.metrics
    decode_time = m.finished_time - m.first_token_time
    return {"ttft_s": m.time_to_first_token, "ttft_steps": first_step,
            "decode_tok_s": (m.num_generated_tokens - 1) / decode_time if decode_time > 0 else None,
            "steps": steps, "sibling_tokens_meanwhile": sibling_tokens_meanwhile,
            "batch_tokens_per_step": batch_tokens / steps,
            "text": out.outputs[0].text, "token_ids": out.outputs[0].token_ids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path (default: the bundled SmolLM2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="2 turns, 24 new tokens, 1 round")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.turns, args.max_tokens, args.rounds = 2, 24, 1
    logging.basicConfig(level=logging.WARNING)
    llm = LLM(args.model or model_source.bundled_gguf_path(), device=args.device, dtype=args.dtype,
              num_kv_blocks=1024)
    modes = {"off": (0, True), "k=1 share": (1, True), "k=2 share": (2, True),
             "k=1 idle": (1, False), "k=2 idle": (2, False),
             "off again": (0, True)}        # A/A control, last in each round: the noise floor
    warm_up = llm.apply_chat_template([{"role": "user", "content": USER_TURNS[0]}])
    for mode in modes.values():              # first calls allocate and warm caches: not measured
        run_turn(llm, warm_up, mode, 4, seed=0)
    per_turn: dict[str, list[dict]] = {m: [] for m in modes}
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(args.turns):
        messages.append({"role": "user", "content": USER_TURNS[turn % len(USER_TURNS)]})
        prompt = llm.apply_chat_template(messages)
        runs = _interleaved(llm, prompt, modes, args, turn)
        reply = runs["off"][0]
        for m, rs in runs.items():
            if any(r["token_ids"] != reply["token_ids"] for r in rs):
                raise SystemExit(f"turn {turn}: the interactive reply changed with siblings {m}")
            per_turn[m].append({"prompt_tokens": len(prompt),
                                **{key: statistics.median(r[key] for r in rs)
                                   for key in ("ttft_s", "ttft_steps", "decode_tok_s", "steps",
                                               "sibling_tokens_meanwhile", "batch_tokens_per_step")}})
        messages.append({"role": "assistant", "content": reply["text"]})
    results = {"config": vars(args), "turns": per_turn, "summary": summarize(per_turn)}
    print_table(results["summary"])
    out = os.path.join(os.path.dirname(__file__), "results", f"background-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {out}")


def _interleaved(llm: LLM, prompt: list[int], modes: dict, args, turn: int) -> dict[str, list[dict]]:
    """Rounds of every mode in turn, so every mode sees the same load over time."""
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m, mode in modes.items():
            runs[m].append(run_turn(llm, prompt, mode, args.max_tokens, seed=turn))
    return runs


def summarize(per_turn: dict[str, list[dict]]) -> dict[str, dict]:
    """Per mode: means over turns, and ratios to off (TTFT: on / off; decode: on / off)."""
    mean = {m: {key: statistics.fmean(t[key] for t in turns)
                for key in ("ttft_s", "ttft_steps", "steps", "decode_tok_s", "sibling_tokens_meanwhile",
                            "batch_tokens_per_step")}
            for m, turns in per_turn.items()}
    off = mean["off"]
    for row in mean.values():
        row["ttft_ratio"] = row["ttft_s"] / off["ttft_s"]
        row["decode_ratio"] = row["decode_tok_s"] / off["decode_tok_s"]
    return mean


def print_table(summary: dict[str, dict]) -> None:
    print("| siblings | TTFT (ms) | TTFT (steps) | reply (steps) | decode tok/s | TTFT on/off "
          "| decode on/off | batch tokens per step | sibling tokens while the reply ran |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m, r in summary.items():
        print(f"| {m} | {r['ttft_s'] * 1000:.0f} | {r['ttft_steps']:.1f} | {r['steps']:.1f} "
              f"| {r['decode_tok_s']:.1f} | {r['ttft_ratio']:.2f} | {r['decode_ratio']:.2f} "
              f"| {r['batch_tokens_per_step']:.1f} | {r['sibling_tokens_meanwhile']:.0f} |")


if __name__ == "__main__":
    main()
