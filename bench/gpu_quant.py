"""Weight-only quantized matmul (Triton, localpaged.kernels.triton_quant_matmul) vs fp16 torch
matmul, on CUDA: the batch-1 weight bandwidth is the figure to report.

For each layer (N x K: 4096x4096, 14336x4096 and 4096x14336, i.e. an 8B model's attention
projection, MLP up and MLP down) and each M (1 and 16 decode rows, 2048 prefill rows) it times
- fp16: ``F.linear`` on an fp16 weight (cuBLAS);
- int8: per-row scales (fp32), the canonical int8 layout;
- int4 g128 / int4 g32: packed nibbles, fp16 scales and mins per group;
- GGUF Q4_K / Q6_K / Q8_0: the file's block bytes (localpaged.kernels.triton_ggml), random
  blocks (ggml_reference.random_blocks);
with fp16 activations, each by ``triton.testing.do_bench`` (L2 flushed before every call, so
weights come from HBM; median of the runs; the split-K sum is part of the timed call).
It reports weight bandwidth = bytes of packed weights + scales (+ mins) / time, its fraction of
the peak (``--peak-gbps``, H200: 4800 GB/s), TFLOP/s, the speed-up over fp16 and the max
relative error against the torch reference (dequantize then fp32 matmul).
Writes a JSON file (``--out``) and prints a table. Every case is timed under its own try: a
failing case (an exception, or an error above MAX_REL_ERR) is recorded with its error, the
others still run, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

logger = logging.getLogger("gpu_quant")
LAYERS = ((4096, 4096), (14336, 4096), (4096, 14336))   # (N, K)
FORMATS = (("int8", 8, None), ("int4 g128", 4, 128), ("int4 g32", 4, 32))
GGUF_FORMATS = ("Q4_K", "Q6_K", "Q8_0")
MAX_REL_ERR = 1e-2   # fp16 output rounding is ~1e-3 of the largest output


def make_weights(N, K, bits, group, gen, device="cuda"):
    """Random packed weights in the canonical layout; scales sized so w ~ N(0, 1/K)."""
    step = 3.0 / K ** 0.5 / (127 if bits == 8 else 7.5)
    if bits == 8:
        q = torch.randint(-127, 128, (N, K), generator=gen, device=device, dtype=torch.int8)
        return q, torch.full((N,), step, device=device), None
    q = torch.randint(0, 256, (N, K // 2), generator=gen, device=device, dtype=torch.uint8)
    scales = torch.full((N, K // group), step, device=device, dtype=torch.float16)
    return q, scales, (-7.5 * scales).contiguous()


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def time_ms(fn) -> float:
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))


def packed_case(x, N, K, bits, group, gen):
    """(run, reference output, weight bytes, extra row fields) of one packed int8/int4 case."""
    from localpaged.kernels import quant_reference as qref
    from localpaged.kernels import triton_quant_matmul as qmm
    q, s, mn = make_weights(N, K, bits, group, gen, x.device)
    ref = qref.quant_matmul_reference(x, q, s, mn, group, bits).float()
    extra = ({"decode_config": qmm.decode_config(x.shape[0], N, K, bits, group, x.device)}
             if x.shape[0] <= qmm.DECODE_MAX_M else {})
    return (lambda: qmm.quant_matmul(x, q, s, mn, group, bits)), ref, nbytes(q, s, mn), extra


def gguf_case(x, N, K, kind):
    """The same for a GGUF block format: the file's bytes, the Triton block kernel."""
    from localpaged.kernels import ggml_reference, triton_ggml
    data = ggml_reference.random_blocks(kind, N, K, scale=0.5 / K ** 0.5).to(x.device)
    ref = (x.float() @ ggml_reference.dequantize(data, kind).T)
    tid = ggml_reference.FORMATS[kind].type_id
    return (lambda: triton_ggml.ggml_matmul(x, data, tid)), ref, nbytes(data), {}


def bench_layer(N, K, M, args, gen, device="cuda") -> list[dict]:
    x = (torch.randn(M, K, generator=gen, device=device) * 0.5).half()
    w16 = (torch.randn(N, K, generator=gen, device=device) / K ** 0.5).half()
    ms16 = time_ms(lambda: F.linear(x, w16))
    rows = [dict(layer=f"{N}x{K}", N=N, K=K, M=M, format="fp16 torch", ms=ms16,
                 weight_bytes=nbytes(w16))]
    del w16
    cases = [(name, lambda b=bits, g=group: packed_case(x, N, K, b, g, gen))
             for name, bits, group in FORMATS]
    cases += [(kind, lambda k=kind: gguf_case(x, N, K, k)) for kind in GGUF_FORMATS]
    for name, make in cases:
        row = dict(layer=f"{N}x{K}", N=N, K=K, M=M, format=name)
        try:
            run, ref, weight_bytes, extra = make()
            out = run().float()
            row["max_rel_err"] = ((out - ref).abs().max() / ref.abs().max()).item()
            if not row["max_rel_err"] <= MAX_REL_ERR:   # NaN fails too
                raise AssertionError(f"max relative error {row['max_rel_err']:.2e} > "
                                     f"{MAX_REL_ERR}: wrong result, not timed")
            row.update(ms=time_ms(run), weight_bytes=weight_bytes, **extra)
            del run, ref, out
        except Exception as exc:   # record and go on: the script runs blind
            logger.exception("%s %dx%d M=%d failed", name, N, K, M)
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    for row in rows:
        if "ms" in row:
            row["GBps"] = row["weight_bytes"] / (row["ms"] * 1e-3) / 1e9
            row["peak_fraction"] = row["GBps"] / args.peak_gbps
            row["TFLOPs"] = 2 * M * N * K / (row["ms"] * 1e-3) / 1e12
            row["speedup_vs_fp16"] = ms16 / row["ms"]
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def print_table(rows) -> None:
    head = (f"{'layer':>11} {'M':>5} {'format':>10} | {'ms':>8} {'GB/s':>7} {'of peak':>7} "
            f"{'TFLOP/s':>8} {'vs fp16':>7} | {'rel err':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['layer']:>11} {r['M']:>5} {r['format']:>10} | FAILED {r['error'][:60]}")
            continue
        err = f"{r['max_rel_err']:.1e}" if "max_rel_err" in r else "-"
        print(f"{r['layer']:>11} {r['M']:>5} {r['format']:>10} | {r['ms']:>8.4f} "
              f"{r['GBps']:>7.0f} {r['peak_fraction']:>7.1%} {r['TFLOPs']:>8.1f} "
              f"{r['speedup_vs_fp16']:>7.2f} | {err:>8}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON path (default: $OUT or bench/results)")
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 16, 2048],
                        help="rows of x (M) to time")
    parser.add_argument("--peak-gbps", type=float, default=4800.0,
                        help="the GPU's peak memory bandwidth (H200: 4800)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out_dir = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results")
    out = args.out or os.path.join(out_dir, "gpu_quant.json")
    result = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node(),
              "torch": torch.__version__, "peak_gbps": args.peak_gbps, "rows": []}
    if not torch.cuda.is_available():
        logger.error("no CUDA device: nothing to benchmark")
        result["skipped"] = "no CUDA device"
    else:
        import triton
        result.update(device=torch.cuda.get_device_name(), triton=triton.__version__)
        gen = torch.Generator(device="cuda").manual_seed(0)
        for M in args.ms:               # M=1 first: the headline figure lands even on a timeout
            for N, K in LAYERS:
                result["rows"] += bench_layer(N, K, M, args, gen)
                for r in result["rows"][-(1 + len(FORMATS) + len(GGUF_FORMATS)):]:
                    logger.info("%s M=%d %s: %s", r["layer"], M, r["format"],
                                r.get("error") or f"{r['ms']:.4f} ms {r['GBps']:.0f} GB/s")
                _write(out, result)     # after every layer, in case a later one hangs
        print_table(result["rows"])
    _write(out, result)
    logger.info("wrote %s", out)
    ok = result["rows"] and not any("error" in r for r in result["rows"])
    return 0 if ok else 1


def _write(path, result) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
