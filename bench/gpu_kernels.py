"""Paged decode attention (Triton) against attention over a contiguous cache (torch SDPA), on CUDA.

For batch 1, 8, 64 and context 512, 2048, 8192 (32 query heads, 8 KV heads, head_dim 128, fp16,
block size 16, every sequence at the full context) it times:
- triton: the public ``paged_decode_attention`` (its heuristic picks plain or split-K);
- plain / split: both variants forced;
- triton_in_order: the public function over a cache whose blocks are in order per sequence
  (the paging overhead alone, as the paper measured it);
- sdpa: ``F.scaled_dot_product_attention`` over contiguous [B, Hkv, L, D] K/V (enable_gqa);
- window: the public function with a sliding window (``--window``, default 1024; where the
  context is longer), which reads only the window's blocks: its time, its error against SDPA
  over the last W tokens, and its time against full attention's (window_vs_full);
and prints the achieved bandwidth (bytes of K/V read / time) and the paged/contiguous time ratio
(the paper reports its paged kernel 20-26% slower than a contiguous one). Block tables are a
random permutation of the block ids, so reads are scattered as in a long-running server.
Writes a JSON file (``--out``) and prints a table.
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

logger = logging.getLogger("gpu_kernels")


def build(batch, context, num_heads, num_kv_heads, head_dim, block_size, dtype, gen,
          device="cuda"):
    """The same K/V three ways: paged with scattered blocks (a random permutation of the block
    ids), paged with each sequence's blocks in order (identity tables), and contiguous
    [B, Hkv, L, D] for SDPA."""
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    contig = [torch.randn(batch, num_kv_heads, context, head_dim, generator=gen,
                          device=device).to(dtype) for _ in range(2)]
    pad = blocks_per_seq * block_size - context
    in_order = [F.pad(x.transpose(1, 2), (0, 0, 0, 0, 0, pad))         # [B, L', Hkv, D]
                .reshape(num_blocks, block_size, num_kv_heads, head_dim) for x in contig]
    identity = torch.arange(num_blocks, device=device, dtype=torch.int32).view(batch, -1)
    perm = torch.randperm(num_blocks, generator=gen, device=device)
    tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    scattered = [torch.empty_like(x) for x in in_order]
    for src, cache in zip(in_order, scattered):
        cache[tables.long().flatten()] = src
    return {"q": torch.randn(batch, num_heads, head_dim, generator=gen,
                             device=device).to(dtype),
            "seq_lens": torch.full((batch,), context, dtype=torch.int32, device=device),
            "scattered": (*scattered, tables), "in_order": (*in_order, identity),
            "contig": contig}


def time_ms(fn) -> float:
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=10, rep=40))


def run(args, device="cuda") -> dict:
    from localpaged.kernels import triton_decode as dec
    num_heads, num_kv_heads, head_dim, block_size = 32, 8, 128, 16
    dtype = torch.float16
    scale = head_dim ** -0.5
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for batch in args.batches:
        for context in args.contexts:
            d = build(batch, context, num_heads, num_kv_heads, head_dim, block_size, dtype, gen,
                      device)
            q, lens = d["q"], d["seq_lens"]
            paged = (q, *d["scattered"][:2], d["scattered"][2], lens, scale)
            ordered = (q, *d["in_order"][:2], d["in_order"][2], lens, scale)
            q4, (kk, vv) = q.unsqueeze(2), d["contig"]                  # q4: [B, H, 1, D]
            fns = {
                "triton": lambda: dec.paged_decode_attention(*paged),
                "plain": lambda: dec.decode_plain(*paged),
                "split": lambda: dec.decode_split_k(*paged),
                "triton_in_order": lambda: dec.paged_decode_attention(*ordered),
                "sdpa": lambda: F.scaled_dot_product_attention(q4, kk, vv, scale=scale,
                                                               enable_gqa=True),
            }
            expected = fns["sdpa"]().squeeze(2).float()
            windowed = context > args.window > 0
            if windowed:
                kw, vw = kk[:, :, -args.window:], vv[:, :, -args.window:]
                expected_window = F.scaled_dot_product_attention(
                    q4, kw, vw, scale=scale, enable_gqa=True).squeeze(2).float()
                fns["window"] = lambda: dec.paged_decode_attention(*paged, args.window)
            max_context = d["scattered"][2].shape[1] * block_size
            row = {"batch": batch, "context": context,
                   "split_k_chosen": dec.use_split_k(batch, num_kv_heads, max_context, q.device)}
            kv_bytes = 2 * batch * context * num_kv_heads * head_dim * q.element_size()
            for name, fn in fns.items():
                if name != "sdpa":
                    want = expected_window if name == "window" else expected
                    row[f"{name}_max_abs_err"] = (fn().float() - want).abs().max().item()
                ms = time_ms(fn)
                row[f"{name}_ms"] = ms
                row[f"{name}_GBps"] = kv_bytes / (ms * 1e-3) / 1e9
            for name in ("triton", "plain", "split", "triton_in_order"):
                row[f"{name}_vs_sdpa"] = row[f"{name}_ms"] / row["sdpa_ms"]
            row["scattered_vs_in_order"] = row["triton_ms"] / row["triton_in_order_ms"]
            if windowed:
                row["window"] = args.window
                row["window_vs_full"] = row["window_ms"] / row["triton_ms"]
                row["window_GBps"] *= args.window / context        # bytes of the window only
            rows.append(row)
            logger.info("B=%-3d L=%-5d triton %.3f ms %.0f GB/s (%s), sdpa %.3f ms %.0f GB/s, "
                        "ratio %.2f, err %.1e", batch, context, row["triton_ms"],
                        row["triton_GBps"], "split" if row["split_k_chosen"] else "plain",
                        row["sdpa_ms"], row["sdpa_GBps"], row["triton_vs_sdpa"],
                        row["triton_max_abs_err"])
            if windowed:
                logger.info("  window %d: %.3f ms (%.2f of full), err %.1e", args.window,
                            row["window_ms"], row["window_vs_full"], row["window_max_abs_err"])
                del kw, vw, expected_window
            del d, q, lens, paged, ordered, q4, kk, vv, fns, expected
            torch.cuda.empty_cache()
    return {"config": {"num_heads": num_heads, "num_kv_heads": num_kv_heads,
                       "head_dim": head_dim, "block_size": block_size, "dtype": "float16"},
            "rows": rows}


def print_table(rows) -> None:
    head = (f"{'B':>3} {'ctx':>5} {'path':>5} | {'triton ms':>9} {'GB/s':>6} | {'plain':>7} "
            f"{'split':>7} {'in-order':>8} | {'sdpa ms':>8} {'GB/s':>6} | {'paged/sdpa':>10} "
            f"{'scat/in-order':>13}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['batch']:>3} {r['context']:>5} {'split' if r['split_k_chosen'] else 'plain':>5}"
              f" | {r['triton_ms']:>9.3f} {r['triton_GBps']:>6.0f} | {r['plain_ms']:>7.3f} "
              f"{r['split_ms']:>7.3f} {r['triton_in_order_ms']:>8.3f} | {r['sdpa_ms']:>8.3f} "
              f"{r['sdpa_GBps']:>6.0f} | {r['triton_vs_sdpa']:>10.2f} "
              f"{r['scattered_vs_in_order']:>13.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON path (default: $OUT or bench/results)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--window", type=int, default=1024,
                        help="sliding window of the windowed rows (0: none)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out_dir = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results")
    out = args.out or os.path.join(out_dir, "gpu_kernels.json")
    result = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node(),
              "torch": torch.__version__}
    if not torch.cuda.is_available():
        logger.error("no CUDA device: nothing to benchmark")
        result["skipped"] = "no CUDA device"
    else:
        import triton
        result.update(device=torch.cuda.get_device_name(), triton=triton.__version__)
        result.update(run(args))
        print_table(result["rows"])
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    logger.info("wrote %s", out)
    return 0 if "rows" in result else 1


if __name__ == "__main__":
    sys.exit(main())
