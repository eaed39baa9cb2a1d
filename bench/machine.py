"""What the machine can read: every benchmark reports it beside its figures (machines differ in
it, and one-conversation decode is bound by reading the weights), and its decode as a share of it;
and what CPU it is (`cpu_model`, `cpu_flags`), which every figure names.

`read_bandwidth` measures it the way STREAM does: arrays of several GiB together (far past the
last-level cache), each read whole by all threads at once (every thread its own contiguous
part), the pass over all of them repeated; it reports the best pass and the median one. The
read is the CPU extension's `read_sum` (kernels/cpu_read.cpp: AVX2 loads into four integer
accumulators, bound by the loads, not by arithmetic); where the extension is not built, torch's
float32 sum, which does more work per byte and reads lower (the result's "kernel" says which).

    python bench/machine.py [--threads 2] [--gib 4] [--repeats 10]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return []
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")
    return [f for f in wanted if f in flags]


def read_bandwidth(threads: int | None = 2, gib: float = 4.0, arrays: int = 4,
                   repeats: int = 10, beside=None) -> dict:
    """GB/s read on `threads` threads (None: as set now) over `arrays` arrays of `gib` GiB in
    all: {"best_GBps", "median_GBps", "bytes", "arrays", "threads", "repeats", "kernel"}.
    `beside` (a function of one array): timed on the same arrays, taking turns with the read pass
    for pass, its "beside_best_GBps" and "beside_median_GBps" added."""
    if threads is not None:
        torch.set_num_threads(threads)
    read, kernel = _reader()
    n = int(gib * 2**30) // arrays // 8
    xs = [torch.ones(n, dtype=torch.int64) for _ in range(arrays)]   # written: every page mapped
    for x in xs:
        read(x)
    seconds, other = [], []
    for _ in range(repeats):
        seconds.append(_seconds(lambda: [read(x) for x in xs]))
        if beside is not None:
            other.append(_seconds(lambda: [beside(x) for x in xs]))
    total = n * 8 * arrays
    result = {"best_GBps": round(total / min(seconds) / 1e9, 2),
              "median_GBps": round(total / statistics.median(seconds) / 1e9, 2),
              "bytes": total, "arrays": arrays, "threads": torch.get_num_threads(),
              "repeats": repeats, "kernel": kernel}
    if other:
        result.update(beside_best_GBps=round(total / min(other) / 1e9, 2),
                      beside_median_GBps=round(total / statistics.median(other) / 1e9, 2))
    return result


def _reader():
    """(read function, its name): the extension's read_sum where it is built, else torch's sum."""
    from localpaged.kernels import cpu_extension
    module = cpu_extension.BUILD.module if cpu_extension.BUILD.wait() else None
    if module is not None and hasattr(module, "read_sum"):
        return module.read_sum, "read_sum (kernels/cpu_read.cpp, AVX2 int64 adds)"
    return (lambda x: x.view(torch.float32).sum()), "torch float32 sum (no CPU extension)"


def describe(bw: dict) -> str:
    """One line for a bench's report: best and median, and how it was measured."""
    return (f"{bw['best_GBps']} GB/s best, {bw['median_GBps']} median ({bw['kernel']}; "
            f"{bw['arrays']} arrays, {bw['bytes'] / 2**30:.0f} GiB, {bw['threads']} threads, "
            f"{bw['repeats']} passes)")


def weight_bytes_per_token(llm) -> int:
    """Bytes of weights one decode step reads (an LLM): all of them but an untied embedding
    table, of which a step gathers one row."""
    from localpaged.quant.linear import weights_summary
    model = llm.engine.model
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    embed = weights_summary(model.model.embed_tokens)[0]
    return llm.stats().weights_bytes - (0 if tied else embed)


def decode_share(tok_s: float | None, bytes_per_token: int, bw: dict) -> float | None:
    """Decode's read rate (tok/s x bytes a token reads) as a share of the best read bandwidth."""
    if not tok_s or not bytes_per_token or not bw.get("best_GBps"):
        return None
    return round(tok_s * bytes_per_token / (bw["best_GBps"] * 1e9), 3)


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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gib", type=float, default=4.0, help="the arrays' size in all (default 4)")
    p.add_argument("--arrays", type=int, default=4)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--torch-sum", action="store_true",
                   help="also torch's float32 sum: over the same arrays, taking turns with the "
                        "read pass for pass, and the earlier measure (over 1 GiB, best of 5)")
    args = p.parse_args(argv)
    beside = (lambda x: x.view(torch.float32).sum()) if args.torch_sum else None
    bw = read_bandwidth(args.threads, args.gib, args.arrays, args.repeats, beside)
    result = {"read_bandwidth": bw, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    print("read bandwidth:", describe(bw))
    if args.torch_sum:
        print(f"torch float32 sum over the same arrays, taking turns: {bw['beside_best_GBps']} "
              f"GB/s best, {bw['beside_median_GBps']} median")
        x = torch.ones(1 << 28, dtype=torch.float32)
        x.sum()
        best = min(_seconds(x.sum) for _ in range(5))
        result["torch_sum_1GiB_GBps"] = round(x.numel() * 4 / best / 1e9, 2)
        print(f"torch float32 sum over 1 GiB, best of 5: {result['torch_sum_1GiB_GBps']} GB/s")
    write_results("machine", result)


if __name__ == "__main__":
    main()
