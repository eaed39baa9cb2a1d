"""The CPU matmul over GGUF quantized blocks (kernels/cpu_ggml.cpp, `ggml_matmul`) at the shapes
of Qwen2.5-1.5B: hidden 1536, q and o 1536x1536, k and v 256x1536, gate and up 8960x1536, down
1536x8960 (28 layers of each), lm_head 151936x1536 (Q6_K; N x K, y = x @ W.T).

For each type (--types, default Q4_K and Q6_K) and shape it reports
- M = 1 (a decode step): GB/s of weight blocks streamed from memory. Each shape is timed over a
  set of distinct copies larger than --stream-mb (default 256 MB, far above the L3), cycled so
  that every call reads its weights from DRAM; the median over --passes passes of the set, and
  the best pass (on a machine busy with other work, the figure closest to the machine alone);
- M = 8 (batched decode) and M = 512 (a prefill chunk): ms per call on one matrix, and GMAC/s;
- ours on the layout the engine keeps: Q4_K, Q5_K and Q6_K interleaved by 8 rows (x8) where the
  build has it (the `layout` column), every other type on GGUF's rows (--rows: all on the rows);
- torch: `F.linear` in float32 on the dequantized weights (M = 1 streamed the same way);
- llama.cpp (--llama-cpp-lib: the folder of libggml-base.so and libggml-cpu.so, e.g. the `lib`
  folder of llama-cpp-python's package; found by itself where `llama_cpp` imports): ggml's own
  `mul_mat` of the same bytes through ctypes (plain ggml buffers, so no repacking; M = 1: one
  graph of the whole set, so its thread start-up is paid once per pass);
- the machine's read bandwidth (bench/machine.py: STREAM-like, several GiB, best and median),
  same threads, and each M = 1 rate as a share of the best;
- a decode step's linears in total: 28 layers of the seven projections + lm_head at M = 1.
Threads: torch's (--threads). --cpu-time: one thread (ours, torch, llama.cpp), each call timed by
the process's CPU time, which other work on a shared machine moves far less than the wall clock.
Prints a table; --json writes the figures.

    .venv/bin/python bench/ggml_kernels.py [--types Q4_K,Q6_K] [--quick] [--cpu-time]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe, read_bandwidth  # noqa: E402

SHAPES = [("q", 1536, 1536), ("k", 256, 1536), ("v", 256, 1536), ("o", 1536, 1536),
          ("gate", 8960, 1536), ("up", 8960, 1536), ("down", 1536, 8960)]
LM_HEAD = ("lm_head", 151936, 1536)
LAYERS = 28
# byte offsets of the float16 scales (d, dmin) in a block, set to sane values in random blocks
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
          "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
          "IQ4_NL": (0,), "IQ4_XS": (0,)}


def random_blocks(type_name: str, N: int, K: int, gen: torch.Generator) -> torch.Tensor:
    import gguf
    elems, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    w = torch.randint(0, 256, (N, K // elems, size), dtype=torch.uint8, generator=gen)
    for offset in HALVES[type_name]:
        d = (torch.rand(N, K // elems, generator=gen) * 0.099 + 1e-3).half()
        w[:, :, offset:offset + 2] = d.view(torch.uint8).view(N, K // elems, 2)
    return w.reshape(N, -1)


def dequantize(w: torch.Tensor, type_name: str) -> torch.Tensor:
    import gguf
    qtype = gguf.GGMLQuantizationType[type_name]
    rows = [gguf.quants.dequantize(w[i:i + 4096].numpy(), qtype) for i in range(0, w.shape[0], 4096)]
    return torch.from_numpy(np.concatenate(rows))


CLOCK = time.perf_counter   # --cpu-time: time.process_time (one thread; what the process spent)


def _seconds(fn) -> float:
    start = CLOCK()
    fn()
    return CLOCK() - start


BEST: dict[int, float] = {}   # id(fn) -> the best time of its last median_time


def median_time(fn, passes: int, min_s: float = 0.2) -> float:
    """Median seconds per call: at least `passes` timings, and at least min_s in all. The best
    one goes to BEST[id(fn)] (on a machine shared with other work, the best is the figure
    closest to the machine alone)."""
    fn()
    times, total = [], 0.0
    while len(times) < passes or total < min_s:
        times.append(_seconds(fn))
        total += times[-1]
    BEST[id(fn)] = min(times)
    return statistics.median(times)


def copies_for(nbytes: int, stream_mb: float) -> int:
    return max(2, int(stream_mb * 1e6 // nbytes) + 1)


# ---- llama.cpp's ggml through ctypes ---------------------------------------------------------

class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class _ThreadpoolParams(ctypes.Structure):   # ggml.h, GGML_MAX_N_THREADS = 512
    _fields_ = [("cpumask", ctypes.c_bool * 512), ("n_threads", ctypes.c_int),
                ("prio", ctypes.c_int), ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool),
                ("paused", ctypes.c_bool)]


class _Cplan(ctypes.Structure):               # ggml-cpu.h
    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", ctypes.c_void_p),
                ("n_threads", ctypes.c_int), ("threadpool", ctypes.c_void_p),
                ("abort_callback", ctypes.c_void_p), ("abort_callback_data", ctypes.c_void_p),
                ("use_ref", ctypes.c_bool)]


class Ggml:
    """ggml's mul_mat: one context and graph of y_i = W_i @ x for a list of weight matrices, run
    on one persistent ggml threadpool (as llama.cpp runs its graphs) with its work buffer."""

    def __init__(self, lib_dir: str, threads: int) -> None:
        self.base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(os.path.join(lib_dir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        b, c, p = self.base, self.cpu, ctypes.c_void_p
        b.ggml_init.restype, b.ggml_init.argtypes = p, [_InitParams]
        b.ggml_new_tensor_2d.restype = p
        b.ggml_new_tensor_2d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        b.ggml_mul_mat.restype, b.ggml_mul_mat.argtypes = p, [p, p, p]
        b.ggml_new_graph.restype, b.ggml_new_graph.argtypes = p, [p]
        b.ggml_build_forward_expand.argtypes = [p, p]
        b.ggml_get_data.restype, b.ggml_get_data.argtypes = p, [p]
        b.ggml_nbytes.restype, b.ggml_nbytes.argtypes = ctypes.c_size_t, [p]
        b.ggml_free.argtypes = [p]
        b.ggml_tensor_overhead.restype = ctypes.c_size_t
        b.ggml_graph_overhead.restype = ctypes.c_size_t
        b.ggml_threadpool_params_default.restype = _ThreadpoolParams
        b.ggml_threadpool_params_default.argtypes = [ctypes.c_int]
        c.ggml_threadpool_new.restype = p
        c.ggml_threadpool_new.argtypes = [ctypes.POINTER(_ThreadpoolParams)]
        c.ggml_threadpool_free.argtypes = [p]
        c.ggml_graph_plan.restype, c.ggml_graph_plan.argtypes = _Cplan, [p, ctypes.c_int, p]
        c.ggml_graph_compute.argtypes = [p, ctypes.POINTER(_Cplan)]
        c.ggml_cpu_init()
        params = b.ggml_threadpool_params_default(threads)
        self.threads, self.pool = threads, c.ggml_threadpool_new(ctypes.byref(params))

    def close(self) -> None:
        self.cpu.ggml_threadpool_free(self.pool)

    def graph(self, weights: list[torch.Tensor], type_id: int, K: int, M: int):
        """A callable computing every W_i @ x (x random), and a function returning (x, y_0)."""
        b = self.base
        size = sum(w.numel() for w in weights) + 4 * M * (K + sum(w.shape[0] for w in weights))
        size += (2 * len(weights) + 2) * (b.ggml_tensor_overhead() + 64) + b.ggml_graph_overhead()
        ctx = b.ggml_init(_InitParams(size + (1 << 20), None, False))
        x = b.ggml_new_tensor_2d(ctx, 0, K, M)
        xs = torch.randn(M, K).numpy()
        ctypes.memmove(b.ggml_get_data(x), xs.ctypes.data, xs.nbytes)
        gf = b.ggml_new_graph(ctx)
        outs = []
        for w in weights:
            t = b.ggml_new_tensor_2d(ctx, type_id, K, w.shape[0])
            assert b.ggml_nbytes(t) == w.numel(), "ggml's row size differs from the bytes"
            ctypes.memmove(b.ggml_get_data(t), w.contiguous().data_ptr(), w.numel())
            outs.append(b.ggml_mul_mat(ctx, t, x))
            b.ggml_build_forward_expand(gf, outs[-1])
        plan = self.cpu.ggml_graph_plan(gf, self.threads, self.pool)
        work = ctypes.create_string_buffer(max(1, plan.work_size))
        plan.work_data = ctypes.cast(work, ctypes.c_void_p)

        def run():
            self.cpu.ggml_graph_compute(gf, ctypes.byref(plan))

        def first_output() -> tuple[torch.Tensor, torch.Tensor]:
            y = np.empty((M, weights[0].shape[0]), np.float32)
            ctypes.memmove(y.ctypes.data, b.ggml_get_data(outs[0]), y.nbytes)
            return torch.from_numpy(xs), torch.from_numpy(y)

        run.work = work                          # alive as long as the graph
        run.free = lambda: b.ggml_free(ctx)
        return run, first_output


def find_llama_cpp_lib(arg: str | None) -> str | None:
    if arg:
        return arg
    try:
        import llama_cpp
    except ImportError:
        return None
    folder = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    return folder if os.path.exists(os.path.join(folder, "libggml-cpu.so")) else None


# ---- the benchmark ---------------------------------------------------------------------------

def bench_shape(module, ggml: Ggml | None, type_name: str, name: str, N: int, K: int,
                args, gen) -> dict:
    import gguf
    type_id = int(gguf.GGMLQuantizationType[type_name])
    w = random_blocks(type_name, N, K, gen)
    nbytes = w.numel()
    # ours on the layout the engine keeps: the x8 interleaved rows where the build has them
    x8 = not args.rows and type_id in module.ggml_interleaved_types() and N % 8 == 0
    ours_id = type_id | module.ggml_interleaved_flag() if x8 else type_id
    row = {"type": type_name, "shape": name, "N": N, "K": K, "MB": nbytes / 1e6,
           "layout": "x8" if x8 else "rows"}

    def ours(t: torch.Tensor) -> torch.Tensor:
        if not x8:
            return t
        out = torch.empty_like(t)
        module.ggml_interleave(t, type_id, out)
        return out

    # M = 1: a set of copies larger than the caches, cycled
    copies = [ours(w) for _ in range(copies_for(nbytes, args.stream_mb))]
    x1 = torch.randn(1, K, generator=gen)

    def stream():
        for c in copies:
            module.ggml_matmul(x1, c, ours_id)

    t1 = median_time(stream, args.passes) / len(copies)
    row.update(m1_us=t1 * 1e6, m1_gbps=nbytes / t1 / 1e9,
               m1_gbps_best=nbytes * len(copies) / BEST[id(stream)] / 1e9)
    W = dequantize(w, type_name)
    xs = {M: torch.randn(M, K, generator=gen) for M in args.batches}
    wo = copies[0]
    for M, x in xs.items():
        t = median_time(lambda x=x: module.ggml_matmul(x, wo, ours_id), args.passes)
        row[f"m{M}_ms"] = t * 1e3
        row[f"m{M}_gmacs"] = M * N * K / t / 1e9
    want = F.linear(xs[args.batches[0]], W)
    got = module.ggml_matmul(xs[args.batches[0]], wo, ours_id)
    row["rel_err"] = ((got - want).abs().max() / want.abs().max()).item()
    copies.clear()

    # torch float32 on the dequantized weights (M = 1 streamed as well: 4 bytes a weight)
    if not args.no_torch:
        fcopies = [W] + [W.clone() for _ in range(copies_for(W.numel() * 4, args.stream_mb) - 1)]
        t = median_time(lambda: [F.linear(x1, c) for c in fcopies], args.passes) / len(fcopies)
        row["torch_m1_us"] = t * 1e6
        fcopies.clear()
        for M, x in xs.items():
            row[f"torch_m{M}_ms"] = median_time(lambda x=x, W=W: F.linear(x, W), args.passes) * 1e3
    W = None                                         # frees the float32 weights

    if ggml is not None:
        group = [w] + [w.clone() for _ in range(copies_for(nbytes, args.stream_mb) - 1)]
        run, first = ggml.graph(group, type_id, K, 1)
        row["lcpp_m1_us"] = median_time(run, args.passes) / len(group) * 1e6
        x0, y0 = first()
        row["lcpp_rel_err_vs_ours"] = ((y0 - module.ggml_matmul(x0, wo, ours_id)).abs().max()
                                       / y0.abs().max()).item()
        run.free()
        del group
        for M in args.batches:
            run, _ = ggml.graph([w], type_id, K, M)
            row[f"lcpp_m{M}_ms"] = median_time(run, args.passes) * 1e3
            run.free()
    return row


def print_table(rows: list[dict], args, bandwidth: dict) -> None:
    cols = [("type", "{:6s}", "type"), ("shape", "{:8s}", "shape"), ("layout", "{:6s}", "layout"),
            ("MB", "{:7.1f}", "MB")]
    cols += [("m1_us", "{:9.0f}", "M=1 us"), ("m1_gbps", "{:7.2f}", "GB/s"),
             ("m1_gbps_best", "{:7.2f}", "best"), ("m1_share", "{:6.0%}", "of bw")]
    cols += [("torch_m1_us", "{:9.0f}", "torch us"), ("lcpp_m1_us", "{:9.0f}", "llama us")]
    for M in args.batches:
        cols += [(f"m{M}_ms", "{:8.2f}", f"M={M} ms"), (f"m{M}_gmacs", "{:6.1f}", "GMAC/s"),
                 (f"torch_m{M}_ms", "{:8.2f}", "torch ms"), (f"lcpp_m{M}_ms", "{:8.2f}", "llama ms")]
    cols += [("rel_err", "{:8.1e}", "rel err")]
    cols = [c for c in cols if any(c[0] in r for r in rows)]
    widths = [max(len(h), len(f.format(0 if k not in ("type", "shape", "layout") else ""))) for k, f, h in cols]
    print("  ".join(h.rjust(wd) for (_, _, h), wd in zip(cols, widths)))
    for r in rows:
        cells = [(f.format(r[k]) if k in r else "-").rjust(wd) for (k, f, _), wd in zip(cols, widths)]
        print("  ".join(cells))
    print("read bandwidth:", describe(bandwidth))


def decode_step(rows: list[dict]) -> dict[str, float]:
    """ms for a decode step's linears at M = 1: 28 layers of the seven projections + lm_head."""
    out = {}
    for key in ("m1_us", "torch_m1_us", "lcpp_m1_us"):
        for type_name in sorted({r["type"] for r in rows}):
            by = {r["shape"]: r for r in rows if r["type"] == type_name}
            head = next((r for r in rows if r["shape"] == "lm_head"), None)
            if all(s in by and key in by[s] for s, _, _ in SHAPES) and head and key in head:
                layer = sum(by[s][key] for s, _, _ in SHAPES)
                out[f"{type_name} layers + Q6_K lm_head, {key}"] = (LAYERS * layer + head[key]) / 1e3
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default="Q4_K,Q6_K")
    parser.add_argument("--batches", default="8,512", help="M values beside 1")
    parser.add_argument("--stream-mb", type=float, default=256.0)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--llama-cpp-lib", default=None)
    parser.add_argument("--no-torch", action="store_true", help="skip torch float32")
    parser.add_argument("--no-lm-head", action="store_true")
    parser.add_argument("--shapes", default=None, help="only these, e.g. gate,down,lm_head")
    parser.add_argument("--quick", action="store_true", help="--passes 3 --stream-mb 128, M=512 "
                        "without lm_head")
    parser.add_argument("--rows", action="store_true",
                        help="ours on GGUF's rows for every type (default: the x8 layout where the build has it)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="one thread, timed by the process's CPU time (a machine shared with other work)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        args.passes, args.stream_mb = 3, 128.0
    if args.cpu_time:
        global CLOCK
        CLOCK, args.threads = time.process_time, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from localpaged.kernels import cpu_extension
    start = time.monotonic()
    if not cpu_extension.BUILD.wait():
        print("the CPU extension is not built (see the log)", file=sys.stderr)
        return 1
    module = cpu_extension.BUILD.module
    print(f"CPU extension ready after {time.monotonic() - start:.1f} s; ggml kernels: "
          f"{module.ggml_kernel_path()}; {torch.get_num_threads()} threads; {platform.processor()}")
    lib = find_llama_cpp_lib(args.llama_cpp_lib)
    ggml = Ggml(lib, torch.get_num_threads()) if lib else None
    print(f"llama.cpp: {lib or 'not found (--llama-cpp-lib)'}")
    bandwidth = read_bandwidth(None)
    print("read bandwidth:", describe(bandwidth), flush=True)
    gen = torch.Generator().manual_seed(0)
    rows = []
    only = set(args.shapes.split(",")) if args.shapes else None
    with torch.inference_mode():
        for type_name in args.types.split(","):
            for name, N, K in SHAPES:
                if only and name not in only:
                    continue
                rows.append(bench_shape(module, ggml, type_name, name, N, K, args, gen))
                rows[-1]["m1_share"] = rows[-1]["m1_gbps"] / bandwidth["best_GBps"]
                print(f"  {type_name} {name}: {rows[-1]['m1_gbps']:.2f} GB/s at M=1 (best pass "
                      f"{rows[-1]['m1_gbps_best']:.2f})", flush=True)
        if not args.no_lm_head and (not only or "lm_head" in only):
            head_args = argparse.Namespace(**vars(args))
            if args.quick:
                head_args.batches = [b for b in args.batches if b <= 64] or [1]
            rows.append(bench_shape(module, ggml, "Q6_K", *LM_HEAD, head_args, gen))
    if ggml is not None:
        ggml.close()
    print_table(rows, args, bandwidth)
    step = decode_step(rows)
    for k, v in step.items():
        print(f"decode step, {k}: {v:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "read_bandwidth": bandwidth, "decode_step_ms": step,
                       "threads": torch.get_num_threads(), "path": module.ggml_kernel_path(),
                       "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
