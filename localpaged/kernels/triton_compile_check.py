"""Compile every Triton kernel of this package for a CUDA target, on a machine without a GPU.

The interpreter (TRITON_INTERPRET=1) runs kernels as Python and misses what only the compiler
checks (non-constexpr globals, type rules in loops, dot shape minimums). This module runs the real
pipeline down to a cubin for sm_90 (Hopper) with the ptxas bundled in the triton wheel, for a
representative set of configurations: ``python -m localpaged.kernels.triton_compile_check``.
Must run with TRITON_INTERPRET unset (the kernels are then JITFunctions). No GPU is touched.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

logger = logging.getLogger(__name__)

_TT = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}


def _compile(kernel, pointers: dict[str, str], floats: tuple[str, ...], constexprs: dict,
             target):
    import triton
    from triton.compiler import ASTSource
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        else:
            signature[name] = "fp32" if name in floats else "i32"
    consts = {(kernel.arg_names.index(k),): v for k, v in constexprs.items()}
    return triton.compile(ASTSource(kernel, signature, constexprs=consts), target=target)


def _cache(dt, int8):
    """Pointer types of k_cache, v_cache and their float32 word views (kernels/kv_quant.py)."""
    cache = "i8" if int8 else dt
    return dict(k_cache=cache, v_cache=cache, k_words="fp32" if int8 else cache,
                v_words="fp32" if int8 else cache)


def _decode(dt, group, block_size, head_dim, split, windowed=False, int8=False):
    from . import triton_decode as dec
    from .triton_common import next_pow2
    out = "fp32" if split else dt
    return dec._decode_kernel, dict(
        q_ptr=dt, **_cache(dt, int8), tables="i32", seq_lens="i32", out_ptr=out,
        lse_ptr="fp32" if split else out), ("qk_scale",), dict(
        GROUP=group, GROUP_PAD=max(16, next_pow2(group)), BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, D_PAD=next_pow2(head_dim),
        TILE_N=dec.default_tile_n(block_size, head_dim), SPLIT=split, DOT_F32=False,
        PREC="ieee" if dt == "fp32" else "tf32", WINDOWED=windowed, INT8=int8)


def _reduce(dt, head_dim):
    from . import triton_decode as dec
    from .triton_common import next_pow2
    return dec._reduce_kernel, dict(part_out="fp32", part_lse="fp32", out_ptr=dt), (), dict(
        PART_CHUNK=dec.REDUCE_CHUNK, HEAD_DIM=head_dim, D_PAD=next_pow2(head_dim))


def _prefill(dt, group, block_size, head_dim, windowed=False, int8=False, opened=False):
    from . import triton_prefill as pre
    from .triton_common import next_pow2
    group_pad = next_pow2(group)
    block_q, tile_n = pre.default_tiles(group_pad, block_size, head_dim, 4 if dt == "fp32" else 2)
    return pre._prefill_kernel, dict(
        q_ptr=dt, **_cache(dt, int8), tables="i32", query_start_loc="i32",
        seq_lens="i32", reach_ptr="i32", out_ptr=dt), ("qk_scale",), dict(
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=max(block_q, -(-16 // group_pad)),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, D_PAD=next_pow2(head_dim),
        TILE_N=tile_n, DOT_F32=False,
        PREC="ieee" if dt == "fp32" else "tf32", WINDOWED=windowed, INT8=int8, OPEN=opened)


def _write_kv(src, cache, block_size, head_dim):
    from . import triton_cache_ops as ops
    from .triton_common import next_pow2
    int8 = cache == "i8"
    return ops._write_kv_kernel, dict(key=src, value=src, **_cache(cache, int8),
                                      slot_mapping="i64"), (), dict(
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, D_PAD=next_pow2(head_dim), INT8=int8)


def _copy_blocks(dt):
    from . import triton_cache_ops as ops
    return ops._copy_blocks_kernel, dict(src=dt, dst=dt, block_mapping="i64"), (), dict(
        CHUNK=ops.COPY_CHUNK)


def _quant(kind, dt, bits, group, block_m, block_n, sub_k, unroll):
    from . import triton_quant_matmul as qmm
    scale = "fp16" if dt == "fp16" else "fp32"
    pointers = dict(x_ptr=dt, q_ptr="i8" if bits == 8 else "u8", s_ptr=scale, mn_ptr=scale,
                    y_ptr=dt if kind == "prefill" else "fp32")
    consts = dict(GROUP=group, BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n, SUB_K=sub_k,
                  UNROLL=unroll, DOT_F32=False, PREC="ieee" if dt == "fp32" else "tf32")
    if kind == "prefill":
        return qmm._prefill_kernel, pointers, (), consts
    return qmm._decode_kernel, pointers, (), dict(consts, USE_DOT=block_m >= 16)


def _ggml(fmt_name, dt, m):
    from . import triton_ggml as gg
    from .ggml_reference import FORMATS
    fmt, cfg = FORMATS[fmt_name], gg.tile_config(m, 4096)
    return gg._ggml_kernel, dict(x_ptr=dt, w_ptr="u8", kv_ptr="i8", y_ptr=dt), (), dict(
        FMT=fmt.type_id, BLOCK_BYTES=fmt.block_bytes, BLOCK_ELEMS=fmt.block_elems,
        BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"], USE_DOT=cfg["use_dot"], DOT_F32=False,
        PREC="ieee" if dt == "fp32" else "tf32")


CONFIGS = {
    "decode split fp16 gqa4 bs16 d128": lambda: _decode("fp16", 4, 16, 128, True),
    "decode split fp16 gqa4 bs16 d128 window": lambda: _decode("fp16", 4, 16, 128, True, True),
    "decode plain bf16 gqa2 bs16 d64 window": lambda: _decode("bf16", 2, 16, 64, False, True),
    "decode plain bf16 gqa1 bs8 d64": lambda: _decode("bf16", 1, 8, 64, False),
    "decode plain fp32 gqa8 bs32 d80": lambda: _decode("fp32", 8, 32, 80, False),
    "reduce fp16 d128": lambda: _reduce("fp16", 128),
    "prefill fp16 gqa4 bs16 d128": lambda: _prefill("fp16", 4, 16, 128),
    "prefill fp16 gqa4 bs16 d128 window": lambda: _prefill("fp16", 4, 16, 128, True),
    "prefill bf16 gqa4 bs16 d256 window open runs": lambda: _prefill("bf16", 4, 16, 256, True,
                                                                      opened=True),
    "prefill bf16 gqa8 bs32 d256": lambda: _prefill("bf16", 8, 32, 256),
    "prefill fp32 gqa1 bs8 d64": lambda: _prefill("fp32", 1, 8, 64),
    "write_kv fp32->fp16 bs16 d80": lambda: _write_kv("fp32", "fp16", 16, 80),
    "write_kv bf16->int8 bs16 d128": lambda: _write_kv("bf16", "i8", 16, 128),
    "decode split int8 kv fp16 gqa4 bs16 d128": lambda: _decode("fp16", 4, 16, 128, True, int8=True),
    "decode plain int8 kv bf16 gqa2 bs16 d64 window": lambda: _decode("bf16", 2, 16, 64, False, True,
                                                                      int8=True),
    "prefill int8 kv bf16 gqa4 bs16 d128": lambda: _prefill("bf16", 4, 16, 128, int8=True),
    "copy_blocks bf16": lambda: _copy_blocks("bf16"),
    "qmm decode int4 fp16 g128 m1": lambda: _quant("decode", "fp16", 4, 128, 1, 16, 128, 2),
    "qmm decode int8 bf16 m16 dot": lambda: _quant("decode", "bf16", 8, 1, 16, 64, 256, 1),
    "qmm decode int4 fp32 g32 m4": lambda: _quant("decode", "fp32", 4, 32, 4, 4, 32, 8),
    "qmm prefill int4 fp16 g32 128x128": lambda: _quant("prefill", "fp16", 4, 32, 128, 128, 32,
                                                         2),
    "qmm prefill int8 bf16 64x64": lambda: _quant("prefill", "bf16", 8, 1, 64, 64, 64, 1),
    "qmm prefill int4 fp32 g64 32x64": lambda: _quant("prefill", "fp32", 4, 64, 32, 64, 64, 1),
    # the GGUF block formats: each format's dequantization is its own branch of one kernel
    "ggml Q4_K fp16 m1": lambda: _ggml("Q4_K", "fp16", 1),
    "ggml Q4_K bf16 m64 dot": lambda: _ggml("Q4_K", "bf16", 64),
    **{f"ggml {name} bf16 m1": (lambda name=name: _ggml(name, "bf16", 1))
       for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q5_K", "Q6_K",
                    "IQ4_NL", "IQ4_XS")},
    "ggml Q6_K fp32 m300 dot": lambda: _ggml("Q6_K", "fp32", 300),
}
# one configuration per kernel, the cheapest to compile: what the test suite runs
QUICK = ("decode split fp16", "reduce", "prefill fp16", "write_kv", "copy_blocks",
         "qmm decode int4 fp16", "qmm prefill int4 fp16", "ggml Q4_K fp16")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10")
    parser.add_argument("-k", default="", help="only configurations containing this text")
    parser.add_argument("--quick", action="store_true", help="one configuration per kernel")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if os.environ.get("TRITON_INTERPRET") == "1":
        logger.error("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
        return 2
    from triton.backends.compiler import GPUTarget
    target = GPUTarget("cuda", args.arch, 32)
    failed = []
    for name, make in CONFIGS.items():
        if args.k not in name or (args.quick and not name.startswith(QUICK)):
            continue
        t0 = time.perf_counter()
        try:
            compiled = _compile(*make(), target=target)
            logger.info("ok    %-36s %5.1fs  shared %6d B", name, time.perf_counter() - t0,
                        compiled.metadata.shared)
        except Exception as exc:  # report every failing kernel, not just the first
            failed.append(name)
            logger.error("FAIL  %s: %s", name, exc)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
