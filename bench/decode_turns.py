"""Decode of one conversation in turns: each engine (and each setting) a fresh process per round,
round after round, so that a VM whose speed drifts over minutes gives every side the same
minutes. bench/real_model.py runs each engine once, one after the other; on a shared VM its
decode figure can land in a fast or a slow stretch for either side.

Sides: `ours` (localpaged, the C++ batch-1 loop), `ours:NAME=VALUE` (ours with that environment
variable, e.g. ours:LOCALPAGED_X8_PREFETCH=1024,4096 for the x8 loops' prefetch distances
before they were chosen per CPU maker) and `llama` (llama-cpp-python, importable). Each process
loads the model, warms up, then decodes --steps greedy tokens (EOS ignored) after a short prompt
and prints ms per step: ours the median engine step, llama.cpp the mean over its steps
(bench/real_model.py's llama_greedy: eval and the argmax of the logits, no sampler).
Prints each round, then per side the median and range, and the ratio of the medians to the
first side; --json writes them.

    PYTHONPATH=<llama-cpp-python's site> python bench/decode_turns.py \
        --sides ours,ours:LOCALPAGED_X8_PREFETCH=1024,4096,llama --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from real_model import CACHE, llama_greedy, model_path  # noqa: E402

PROMPT = list(range(100, 140))


def child_ours(path: str, steps: int, threads: int) -> float:
    import torch
    torch.set_num_threads(threads)
    from localpaged import LLM, SamplingParams
    llm = LLM(path, device="cpu", num_kv_blocks=512, max_model_len=4096)
    batch1 = llm.engine.runner.batch1
    if batch1 is not None:
        batch1.wait()
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    llm.generate([PROMPT], params)                       # warm-up
    llm.reset_prefix_cache()
    eng = llm.engine
    eng.add_request(None, PROMPT, params)
    eng.step()                                           # the prefill
    times = []
    while eng.has_unfinished_requests():
        start = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def child_llama(path: str, steps: int, threads: int) -> float:
    import llama_cpp
    model = llama_cpp.Llama(path, n_threads=threads, n_threads_batch=threads, n_ctx=2048, verbose=False)
    llama_greedy(model, PROMPT, 5)                       # warm-up
    _ids, seconds = llama_greedy(model, PROMPT, steps + 1)
    return 1000 * seconds / steps


def run_side(side: str, path: str, steps: int, threads: int) -> float:
    kind, _, setting = side.partition(":")
    env = dict(os.environ)
    if setting:
        name, _, value = setting.partition("=")
        env[name] = value
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--model", path,
                          "--steps", str(steps), "--threads", str(threads)],
                         env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF (default: bench/real_model.py's 1.5B-class Q4_K_M)")
    ap.add_argument("--sides", default="ours,llama",
                    help="comma-separated: ours, ours:NAME=VALUE, llama (a VALUE may hold commas "
                         "after its '=')")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", choices=["ours", "llama"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = args.model or str(model_path(CACHE))
    if args.child:
        fn = child_ours if args.child == "ours" else child_llama
        print(f"{fn(path, args.steps, args.threads):.3f}")
        return
    sides = _split_sides(args.sides)
    rows: dict[str, list[float]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in sides:
            ms = run_side(side, path, args.steps, args.threads)
            rows[side].append(ms)
            print(f"{time.strftime('%H:%M:%S')} round {r + 1} {side}: {ms:.2f} ms/step "
                  f"({1000 / ms:.1f} tok/s)", flush=True)
    first = statistics.median(rows[sides[0]])
    summary = {}
    for side, ms in rows.items():
        med = statistics.median(ms)
        summary[side] = {"median_ms": round(med, 2), "min_ms": round(min(ms), 2),
                         "max_ms": round(max(ms), 2), "tok_s": round(1000 / med, 2),
                         "speed_vs_first": round(first / med, 3), "each_ms": ms}
        print(f"{side}: median {med:.2f} ms/step ({1000 / med:.1f} tok/s), range "
              f"{min(ms):.2f}-{max(ms):.2f}; {sides[0]} is {med / first:.2f}x its speed")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": path, "threads": args.threads,
                                               "steps": args.steps, "sides": summary}, indent=1))


def _split_sides(text: str) -> list[str]:
    """'ours,ours:X=1,2,llama' -> ['ours', 'ours:X=1,2', 'llama']: a piece without ':' or '='
    that is not a side name continues the VALUE before it."""
    sides: list[str] = []
    for piece in text.split(","):
        if sides and piece not in ("ours", "llama") and not piece.startswith("ours:"):
            sides[-1] += "," + piece
        else:
            sides.append(piece)
    return sides


if __name__ == "__main__":
    main()
