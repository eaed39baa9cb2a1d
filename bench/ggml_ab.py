"""Two versions of the CPU GGUF kernels side by side in one process: cpu_ggml.cpp and its parts from
two source folders (e.g. a checkout of the commit before and the working tree), each built alone
with its torch-ops binding (kernels/cpu_ggml_module.cpp), timed in turns (A, B, A, B, ...) on the
same weights and x, so that the load of a shared machine falls on both alike. The weights are in
the layout the engine keeps (x8 where the build interleaves the type); every result of B is
checked bitwise against A's.

For each type (--types), shape (gate 8960x1536, down 1536x8960: Qwen2.5-1.5B's MLP) and M
(--batches): GMAC/s of each build, best and median over --repeats turns. --cpu-time (default on):
one thread, timed by the process's CPU time (time.process_time), the figure other work on the machine moves
least; --wall: torch's threads, wall clock. --march builds both for another target (haswell: the
AVX2 path). The weights are small enough to stay in the L3 cache: compute, not streaming from DRAM
(bench/ggml_kernels.py streams M = 1).

    .venv/bin/python bench/ggml_ab.py --a /tmp/before/localpaged/kernels [--b localpaged/kernels]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ggml_kernels import random_blocks  # noqa: E402

SHAPES = [("gate", 8960, 1536), ("down", 1536, 8960)]


def build(name: str, src: str, march: str, folder: str):
    from torch.utils.cpp_extension import load
    load(name, [f"{src}/cpu_ggml.cpp", f"{src}/cpu_ggml_module.cpp"], extra_include_paths=[src],
         extra_cflags=["-O3", f"-march={march}", "-fopenmp"], extra_ldflags=["-fopenmp"],
         build_directory=folder, is_python_module=False, verbose=False)
    return getattr(torch.ops, name)


def main() -> int:
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "localpaged", "kernels")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="folder of the first version's cpu_ggml*.{cpp,h,inc}")
    ap.add_argument("--b", default=here, help="the second version's (default: this tree's)")
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--batches", default="1,8,64,512")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--march", default="native")
    ap.add_argument("--wall", action="store_true", help="torch's threads, wall clock")
    args = ap.parse_args()
    import gguf
    clock = time.perf_counter if args.wall else time.process_time
    if not args.wall:
        torch.set_num_threads(1)
    tag = args.march.replace("-", "_")
    with tempfile.TemporaryDirectory() as tmp:
        builds = {}
        for key, src in (("A", args.a), ("B", args.b)):
            os.makedirs(f"{tmp}/{key}")
            builds[key] = build(f"localpaged_ggml_ab_{key}_{tag}", src, args.march, f"{tmp}/{key}")
        print(f"A: {args.a}\nB: {args.b}\n-march={args.march}; {'wall clock, ' + str(torch.get_num_threads()) + ' threads' if args.wall else 'one thread, CPU time'}; "
              f"paths: {builds['A'].ggml_kernel_path()} / {builds['B'].ggml_kernel_path()}", flush=True)
        gen = torch.Generator().manual_seed(0)
        for type_name in args.types.split(","):
            type_id = int(gguf.GGMLQuantizationType[type_name])
            for name, N, K in SHAPES:
                w = random_blocks(type_name, N, K, gen)
                weights = {}
                for key, ops in builds.items():
                    if type_id in list(ops.ggml_interleaved_types()):
                        out = torch.empty_like(w)
                        ops.ggml_interleave(w, type_id, out)
                        weights[key] = (out, type_id | ops.ggml_interleaved_flag())
                    else:
                        weights[key] = (w, type_id)
                for M in (int(m) for m in args.batches.split(",")):
                    x = torch.randn(M, K, generator=gen)
                    calls = max(1, int(2e9 / (M * N * K)))
                    times: dict[str, list[float]] = {key: [] for key in builds}
                    ys = {}
                    for _ in range(args.repeats):
                        for key, ops in builds.items():
                            wk, tid = weights[key]
                            ys[key] = ops.ggml_matmul(x, wk, tid)
                            start = clock()
                            for _ in range(calls):
                                ops.ggml_matmul(x, wk, tid)
                            times[key].append((clock() - start) / calls)
                    same = torch.equal(ys["A"], ys["B"])
                    cells = [f"{key} {M * N * K / min(t) / 1e9:6.1f} best {M * N * K / statistics.median(t) / 1e9:6.1f} median"
                             for key, t in times.items()]
                    print(f"{type_name} {name} {N}x{K} M={M}: " + " | ".join(cells)
                          + f" GMAC/s; B/A {min(times['A']) / min(times['B']):.2f}x"
                          + ("" if same else "  y DIFFERS"), flush=True)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
