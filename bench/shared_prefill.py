"""What shared prefill and the MLP's row passes each give the 8-chat workload of
bench/real_model.py (the four combinations), and the passes a 1,000-token prefill run in a
thread as the app's engine runs (with and without), in one process, in turns.

    python bench/shared_prefill.py [--model FILE] [--rounds 2]

The file is bench/real_model.py's cached 1.5B-shaped Q4_K_M (made by it; --model for another
GGUF). Its 8 chats are four pairs of prompts that share their pasted notes (bench/workload.py):
with shared prefill (core/shared_prefill.py) the second of a pair waits a step and takes the
common blocks from the prefix cache. "off" sets MIN_SHARED_BLOCKS out of reach, and the MLP's
passes (models/llama.py CPU_ACTIVATION_BYTES) above any chunk. Prints tok/s and the tokens the
model computed per combination, and the prefill's seconds; writes
bench/results/shared-prefill-<time>.json.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import real_model  # noqa: E402
from machine import write_results  # noqa: E402

COMBINATIONS = [("both", True, True), ("no shared prefill", True, False),
                ("no passes", False, True), ("neither", False, False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=real_model.model_path(real_model.CACHE))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from localpaged import LLM, SamplingParams
    from localpaged.core import shared_prefill
    from localpaged.models import llama
    torch.set_num_threads(args.threads)
    made = real_model.make_prompts(args.model, 1000, 8)
    prompts = made["chats"]
    llm = LLM(str(args.model), num_kv_blocks=sum(len(p) + 64 for p in prompts) // 16 + 32)
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0))       # warm-up
    passes_bytes, min_blocks = llama.CPU_ACTIVATION_BYTES, shared_prefill.MIN_SHARED_BLOCKS
    runs = []
    for round_ in range(args.rounds):
        for label, passes, sharing in COMBINATIONS:
            llama.CPU_ACTIVATION_BYTES = passes_bytes if passes else 1 << 40
            shared_prefill.MIN_SHARED_BLOCKS = min_blocks if sharing else 1 << 30
            llm.reset_prefix_cache()
            computed, start = llm.engine.num_tokens_computed, time.perf_counter()
            outs = llm.generate(prompts, params)
            seconds = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            runs.append({"round": round_, "combination": label, "seconds": round(seconds, 2),
                         "tok_s": round(tokens / seconds, 2),
                         "tokens_computed": llm.engine.num_tokens_computed - computed})
            print(f"{label}: {tokens / seconds:.2f} tok/s ({seconds:.2f} s), "
                  f"{runs[-1]['tokens_computed']} tokens computed", flush=True)
        for passes in (True, False):
            llama.CPU_ACTIVATION_BYTES = passes_bytes if passes else 1 << 40
            llm.reset_prefix_cache()
            seconds = in_thread(lambda: llm.generate([made["long"]], SamplingParams(max_tokens=1)))
            runs.append({"round": round_, "prefill": len(made["long"]), "passes": passes,
                         "seconds": round(seconds, 2)})
            print(f"prefill of {len(made['long'])} tokens in a thread, "
                  f"{'passes' if passes else 'one pass'}: {seconds:.2f} s", flush=True)
    write_results("shared-prefill", {"model": str(args.model), "threads": args.threads,
                                     "prompt_tokens": [len(p) for p in prompts], "runs": runs})


def in_thread(work) -> float:
    """Seconds `work()` takes in a new thread (whose allocations glibc serves from an arena of
    its own, as for the app's engine thread)."""
    took = []

    def run():
        start = time.perf_counter()
        work()
        took.append(time.perf_counter() - start)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return took[0]


if __name__ == "__main__":
    main()
