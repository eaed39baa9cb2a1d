"""A bf16 GEMM on dequantized weights against the CPU GGUF kernel's integer tiles, for prefill-sized
batches: is a float GEMM (oneDNN through torch, AVX-512 BF16 where the CPU has it) faster than
cpu_ggml.cpp's int8 products on a GGUF matrix?

For each type (--types), shape (gate and up 8960x1536, down 1536x8960: Qwen2.5-1.5B's MLP) and M
(--batches, default 512 and 1000), in turns in one process:
- ours: `ggml_matmul` on the weights in the layout the engine keeps (x8 where the build interleaves
  the type), x float32 in, y float32 out;
- bf16: `torch.mm(x.bfloat16(), W.T)` with W the gguf-py dequantization of the same blocks, kept
  in bfloat16 (2 bytes a weight, 3.6x a Q4_K matrix: dequantized once, outside the timing, so the
  figure is a lower bound on any bf16 path that dequantizes panels per call), and y back to
  float32;
- bf16+dq: the same plus the cost of making W each call (a float32 -> bfloat16 copy of the
  dequantized matrix, which is less than dequantizing GGUF blocks costs: a lower bound too).
GMAC/s, best and median over --repeats turns; --cpu-time (default): one thread, the process's CPU
time; --wall: torch's threads, wall clock. Whether the bf16 result is bitwise the same on 1 and 2
threads is printed (the engine needs a row's y not to depend on the batch or the threads). The
kernel is built alone from this tree (bench/ggml_ab.py's build); --march as there.

    .venv/bin/python bench/ggml_bf16.py [--types Q4_K,Q6_K] [--batches 512,1000] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ggml_ab import build  # noqa: E402
from ggml_kernels import dequantize, random_blocks  # noqa: E402

SHAPES = [("gate", 8960, 1536), ("up", 8960, 1536), ("down", 1536, 8960)]


def cpu_line() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return platform.processor()
    field = {}
    for line in text.splitlines():
        if ":" in line:
            key, value = (s.strip() for s in line.split(":", 1))
            field.setdefault(key, value)
    flags = set(field.get("flags", "").split())
    wanted = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags]
    return (f"{field.get('model name', '?')}, family {field.get('cpu family', '?')} model {field.get('model', '?')}, "
            f"{os.cpu_count()} CPUs; flags: {' '.join(wanted)}")


def main() -> int:
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "localpaged", "kernels")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--batches", default="512,1000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--march", default="native")
    ap.add_argument("--wall", action="store_true", help="torch's threads, wall clock")
    ap.add_argument("--out", default=None, help="also write the lines to this file")
    args = ap.parse_args()
    import gguf
    clock = time.perf_counter if args.wall else time.process_time
    threads = torch.get_num_threads()
    if not args.wall:
        torch.set_num_threads(1)
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    with tempfile.TemporaryDirectory() as tmp:
        ops = build(f"localpaged_ggml_bf16_{args.march.replace('-', '_')}", here, args.march, tmp)
        say(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; {cpu_line()}")
        say(f"torch {torch.__version__}, mkldnn {torch.backends.mkldnn.is_available()}; -march={args.march}, "
            f"path {ops.ggml_kernel_path()}; "
            + (f"wall clock, {torch.get_num_threads()} threads" if args.wall else "one thread, CPU time"))
        gen = torch.Generator().manual_seed(0)
        for type_name in args.types.split(","):
            type_id = int(gguf.GGMLQuantizationType[type_name])
            for name, N, K in SHAPES:
                w = random_blocks(type_name, N, K, gen)
                tid = type_id
                if type_id in list(ops.ggml_interleaved_types()):
                    wk = torch.empty_like(w)
                    ops.ggml_interleave(w, type_id, wk)
                    tid = type_id | ops.ggml_interleaved_flag()
                else:
                    wk = w
                W32 = dequantize(w, type_name)
                W16 = W32.bfloat16()
                for M in (int(m) for m in args.batches.split(",")):
                    x = torch.randn(M, K, generator=gen)
                    runs = {
                        "ours": lambda: ops.ggml_matmul(x, wk, tid),
                        "bf16": lambda: torch.mm(x.bfloat16(), W16.T).float(),
                        "bf16+dq": lambda: torch.mm(x.bfloat16(), W32.bfloat16().T).float(),
                    }
                    times: dict[str, list[float]] = {key: [] for key in runs}
                    for _ in range(args.repeats):
                        for key, fn in runs.items():
                            fn()
                            start = clock()
                            fn()
                            times[key].append(clock() - start)
                    ref = x.double() @ W32.double().T
                    err = {key: ((fn() - ref).abs().max() / ref.abs().max()).item() for key, fn in
                           (("ours", runs["ours"]), ("bf16", runs["bf16"]))}
                    torch.set_num_threads(1)
                    one = runs["bf16"]()
                    torch.set_num_threads(max(2, threads))
                    same = torch.equal(one, runs["bf16"]())
                    torch.set_num_threads(threads if args.wall else 1)
                    macs = M * N * K
                    cells = " | ".join(f"{key} {macs / min(t) / 1e9:6.1f} best {macs / statistics.median(t) / 1e9:6.1f} median"
                                       for key, t in times.items())
                    say(f"{type_name} {name} {N}x{K} M={M}: {cells} GMAC/s; bf16/ours {min(times['ours']) / min(times['bf16']):.2f}x; "
                        f"max error / max|y|: ours {err['ours']:.1e}, bf16 {err['bf16']:.1e}; "
                        f"bf16 y on 1 and {max(2, threads)} threads {'bitwise the same' if same else 'DIFFERENT'}")
    say("load average: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
