"""What the machine can read: every benchmark reports it beside its figures (machines differ in
it, and one-conversation decode is bound by reading the weights)."""

from __future__ import annotations

import time

import torch


def read_bandwidth(threads: int | None = 2) -> float:
    """GB/s of torch's sum over 1 GiB of float32 on `threads` threads (None: as set now), best
    of 5."""
    if threads is not None:
        torch.set_num_threads(threads)
    x = torch.ones(1 << 28, dtype=torch.float32)
    x.sum()
    best = min(_seconds(x.sum) for _ in range(5))
    return round(x.numel() * 4 / best / 1e9, 2)


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def write_results(name: str, result: dict) -> str:
    """bench/results/<name>-<time>.json with `result`; prints and returns the path."""
    import json
    import os
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print("wrote", out)
    return out
