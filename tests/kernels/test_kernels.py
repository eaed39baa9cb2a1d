"""Triton kernels (localpaged.kernels.triton_*) against the torch references, seeded random cases.

Runs on CPU under the Triton interpreter (TRITON_INTERPRET=1, set below when there is no CUDA) and
on CUDA when present (compiled kernels; the CPU cases then skip unless TRITON_INTERPRET=1 is set).

Every case uses ragged sequence lengths including 1 and an exact multiple of the block size,
block tables that are a random permutation of the block ids (with spare unused blocks), one block
shared by two sequences, and caches whose slots outside every sequence are NaN for the Triton call
(so a read past seq_len or of a padding table entry shows up as NaN).

Tolerances (max abs and rel difference to the reference, outputs are O(1)):
  fp32: atol 2e-5, rtol 1e-4   (fp32 dots in IEEE mode, not TF32)
  fp16: atol 3e-3, rtol 1e-2   (probabilities rounded to fp16 before P@V; output rounding)
  bf16: atol 2e-2, rtol 2e-2   (same in bf16; the interpreter upcasts bf16 dots to fp32)
write_kv and copy_blocks move bytes and must match exactly.
"""

import os

import torch  # does not import triton

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"   # tests/conftest.py normally did this already

import importlib.util  # noqa: E402
import logging  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import zlib  # noqa: E402

import pytest  # noqa: E402
import triton.language as tl  # noqa: E402

from localpaged.kernels import reference as ref  # noqa: E402
from localpaged.kernels import triton_common as common  # noqa: E402
from localpaged.kernels import triton_decode as decode  # noqa: E402
from localpaged.kernels import triton_ops as ops  # noqa: E402
from localpaged.kernels import triton_prefill as prefill_mod  # noqa: E402

# Interpretation is fixed when triton itself is imported (tl.zeros and friends are @jit too). If
# something imported triton before TRITON_INTERPRET=1 was set and there is no GPU, nothing can run
# in this process: the tests then skip here and test_in_fresh_process reruns this file.
INTERPRETED = common.is_interpreted(decode._decode_kernel) and common.is_interpreted(tl.zeros)
STALE = not INTERPRETED and not torch.cuda.is_available()
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason=(
        "triton imported before TRITON_INTERPRET=1 (see test_in_fresh_process)" if STALE else
        "Triton compiled for CUDA; CPU needs TRITON_INTERPRET=1"))),
    pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device")),
]


def run_interpreted(test_file: str) -> None:
    """Run a test file in a fresh process with TRITON_INTERPRET=1; assert it passed."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout


@pytest.mark.skipif(not STALE, reason="the kernel tests run in this process")
def test_in_fresh_process():
    run_interpreted(__file__)


TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (3e-3, 1e-2), torch.bfloat16: (2e-2, 2e-2)}
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def assert_close(actual, expected, dtype):
    atol, rtol = TOL[dtype]
    assert not actual.isnan().any(), "NaN in the kernel output: it read a poisoned slot"
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), atol=atol, rtol=rtol)


class PagedCase:
    """Random paged K/V caches and block tables for ``lens`` tokens per sequence."""

    def __init__(self, seed, lens, block_size, num_kv_heads, head_dim, dtype, device,
                 spare_blocks=3, extra_table_cols=0):
        gen = torch.Generator().manual_seed(seed)
        self.lens, self.block_size = list(lens), block_size
        nblocks = [-(-n // block_size) for n in self.lens]
        num_blocks = sum(nblocks) + spare_blocks
        perm = torch.randperm(num_blocks, generator=gen).tolist()   # scattered physical ids
        width = max(nblocks) + extra_table_cols
        tables = torch.full((len(self.lens), width), -1, dtype=torch.int32)
        for b, n in enumerate(nblocks):
            tables[b, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)
        if len(self.lens) >= 2:   # the last sequence shares its first block with the one before
            tables[-1, 0] = tables[-2, 0]
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
        self.v_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
        self.tables = tables.to(device)
        self.seq_lens = torch.tensor(self.lens, dtype=torch.int32, device=device)
        self.gen = gen

    def valid_slots(self):
        slots = set()
        for b, n in enumerate(self.lens):
            for pos in range(n):
                blk = int(self.tables[b, pos // self.block_size])
                slots.add(blk * self.block_size + pos % self.block_size)
        return slots

    def poisoned(self):
        """Copies of the caches with NaN in every slot no sequence may read."""
        out = []
        keep = torch.zeros(self.k_cache.shape[0] * self.block_size, dtype=torch.bool)
        keep[sorted(self.valid_slots())] = True
        for cache in (self.k_cache, self.v_cache):
            flat = cache.clone().flatten(0, 1)
            flat[~keep.to(cache.device)] = float("nan")
            out.append(flat.view(cache.shape))
        return out

    def randn(self, *shape, dtype):
        return torch.randn(shape, generator=self.gen).to(dtype).to(self.k_cache.device)


def seed_of(*parts):
    """A per-case seed that, unlike hash(), does not change between processes."""
    return zlib.crc32(repr(parts).encode())


def ragged_lens(seed, batch, max_len, block_size):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len + 1, (batch,), generator=gen).tolist()
    lens[0] = 1
    lens[1] = 2 * block_size                          # exact multiple of the block size
    lens[-1] = max_len                                # the longest
    return lens


# (block_size, gqa ratio, dtype, head_dim): every block size, ratio and dtype, head dims 64/128
# plus 80 (padded to 128) and 256.
DECODE_CASES = [
    (8, 1, F32, 64), (16, 2, F16, 128), (32, 4, BF16, 64),
    (8, 8, F16, 64), (16, 4, F32, 80), (32, 1, F16, 256), (8, 2, BF16, 128), (32, 8, F32, 128),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["plain", "split"])
@pytest.mark.parametrize("block_size,group,dtype,head_dim", DECODE_CASES)
def test_decode(device, variant, block_size, group, dtype, head_dim, monkeypatch):
    seed = seed_of(block_size, group, dtype, head_dim)
    num_kv_heads = 2
    lens = ragged_lens(seed, 4, 5 * block_size + 3, block_size)
    case = PagedCase(seed, lens, block_size, num_kv_heads, head_dim, dtype, device,
                     extra_table_cols=2)   # trailing padding columns, empty split partitions
    q = case.randn(len(lens), num_kv_heads * group, head_dim, dtype=dtype)
    scale = head_dim ** -0.5
    expected = ref.paged_decode_attention(q, case.k_cache, case.v_cache, case.tables,
                                          case.seq_lens, scale)
    k_poison, v_poison = case.poisoned()
    if variant == "plain":
        out = decode.decode_plain(q, k_poison, v_poison, case.tables, case.seq_lens, scale)
    else:   # small partitions so several are used, some empty; tiles inside and across blocks
        monkeypatch.setattr(decode, "REDUCE_CHUNK", 2)     # the reduce loops over chunks too
        partition = 32 if block_size == 32 else 16                  # tile_n is 16
        assert case.tables.shape[1] * block_size // partition >= 4
        out = decode.decode_split_k(q, k_poison, v_poison, case.tables, case.seq_lens, scale,
                                    partition_size=partition, tile_n=16)
    assert out.shape == q.shape and out.dtype == dtype
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wide_table", [False, True])
def test_decode_dispatch(device, wide_table):
    """The public function: a narrow table takes the plain path, a wide one (long max context,
    one sequence) the split-K path; both match the reference."""
    block_size, num_kv_heads, head_dim = 16, 2, 64
    extra = 2 * decode.PARTITION_SIZE // block_size if wide_table else 0
    case = PagedCase(7, [1, 37], block_size, num_kv_heads, head_dim, F16, device,
                     extra_table_cols=extra)
    max_context = case.tables.shape[1] * block_size
    assert decode.use_split_k(2, num_kv_heads, max_context, case.k_cache.device) == wide_table
    q = case.randn(2, 4 * num_kv_heads, head_dim, dtype=F16)
    args = (q, case.k_cache, case.v_cache, case.tables, case.seq_lens, 0.125)
    assert_close(ops.paged_decode_attention(*args), ref.paged_decode_attention(*args), F16)


def test_split_k_heuristic():
    cpu = torch.device("cpu")
    assert decode.use_split_k(1, 8, 8192, cpu)          # one long sequence
    assert not decode.use_split_k(1, 8, 128, cpu)       # short context
    assert not decode.use_split_k(64, 8, 8192, cpu)     # enough programs already


# (block_size, gqa ratio, dtype, head_dim, block_q)
PREFILL_CASES = [
    (8, 1, F32, 64, None), (16, 2, F16, 128, 4), (32, 4, BF16, 64, None),
    (16, 8, F32, 64, 2), (8, 4, F16, 80, None), (32, 2, F32, 128, 8),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size,group,dtype,head_dim,block_q", PREFILL_CASES)
def test_prefill(device, block_size, group, dtype, head_dim, block_q):
    seed = seed_of("prefill", block_size, group, dtype, head_dim)
    num_kv_heads = 2
    lens = [1, 2 * block_size, 3 * block_size + 5, 19, 41, 7]
    # q_len per sequence: a 1-token prompt, a whole prompt on block boundaries, a chunk after a
    # cached prefix, a single new token after a prefix, a whole prompt, an idle sequence (0).
    q_lens = [1, 2 * block_size, 20, 1, 41, 0]
    case = PagedCase(seed, lens, block_size, num_kv_heads, head_dim, dtype, device)
    starts = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    q = case.randn(int(starts[-1]), num_kv_heads * group, head_dim, dtype=dtype)
    scale = head_dim ** -0.5
    starts = starts.to(device)
    expected = ref.paged_prefill_attention(q, case.k_cache, case.v_cache, case.tables, starts,
                                           case.seq_lens, scale)
    k_poison, v_poison = case.poisoned()
    out = prefill_mod.prefill(q, k_poison, v_poison, case.tables, starts, case.seq_lens, scale,
                              block_q=block_q)
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_write_prefill_decode_match_dense_attention(device):
    """End to end through the public API: write_kv a prompt plus one token, prefill the prompt,
    decode the token; both equal causal SDPA over contiguous K/V (independent of the reference).
    """
    block_size, num_kv_heads, group, head_dim, n = 8, 2, 4, 64, 29
    num_heads = num_kv_heads * group
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, h, head_dim, generator=gen).to(device)
               for h in (num_heads, num_kv_heads, num_kv_heads))
    k_cache = torch.zeros(8, block_size, num_kv_heads, head_dim, device=device)
    v_cache = torch.zeros_like(k_cache)
    table = torch.tensor([[5, 2, 7, 0]], dtype=torch.int32, device=device)
    slots = (table[0].long()[torch.arange(n, device=device) // block_size] * block_size
             + torch.arange(n, device=device) % block_size)
    ops.write_kv(k, v, k_cache, v_cache, slots)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=0.125,
        enable_gqa=True).transpose(0, 1)
    starts = torch.tensor([0, n - 1], dtype=torch.int32, device=device)
    lens = torch.tensor([n - 1], dtype=torch.int32, device=device)
    out = ops.paged_prefill_attention(q[:-1], k_cache, v_cache, table, starts, lens, 0.125)
    assert_close(out, dense[:-1], F32)
    out = ops.paged_decode_attention(q[-1:], k_cache, v_cache, table, lens + 1, 0.125)
    assert_close(out, dense[-1:], F32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size,head_dim,src_dtype,cache_dtype",
                         [(8, 64, F32, F32), (16, 80, F32, F16), (32, 128, BF16, BF16)])
def test_write_kv(device, block_size, head_dim, src_dtype, cache_dtype):
    gen = torch.Generator().manual_seed(block_size)
    num_tokens, num_kv_heads, num_blocks = 23, 2, 6
    # key/value as non-contiguous slices of one packed projection, as a model produces them
    packed = torch.randn(num_tokens, 3, num_kv_heads, head_dim, generator=gen).to(src_dtype)
    key, value = packed.to(device)[:, 1], packed.to(device)[:, 2]
    assert not key.is_contiguous()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[0, 5, 6, -1]] = -1                                   # skipped tokens
    slots = slots.to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(cache_dtype).to(device)
    v_cache = torch.randn(shape, generator=gen).to(cache_dtype).to(device)
    k_exp, v_exp = k_cache.clone(), v_cache.clone()
    ref.write_kv(key, value, k_exp, v_exp, slots)
    ops.write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_exp) and torch.equal(v_cache, v_exp)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("same_tensor", [True, False])
@pytest.mark.parametrize("block_size,dtype", [(8, F32), (16, F16), (32, BF16)])
def test_copy_blocks(device, same_tensor, block_size, dtype):
    gen = torch.Generator().manual_seed(block_size + same_tensor)
    num_blocks = 24
    src = torch.randn(num_blocks, block_size, 2, 80, generator=gen).to(dtype).to(device)
    dst = src if same_tensor else torch.randn(src.shape, generator=gen).to(dtype).to(device)
    perm = torch.randperm(num_blocks, generator=gen)
    mapping = torch.stack([perm[:9], perm[9:18]], dim=1)   # sources and destinations disjoint
    mapping[3, 0] = mapping[4, 0]                         # one source copied twice
    expected = dst.clone()
    ref.copy_blocks(expected if same_tensor else src, expected, mapping)
    ops.copy_blocks(src, dst, mapping)
    assert torch.equal(dst, expected)
    ops.copy_blocks(src, dst, torch.empty(0, 2, dtype=torch.int64))   # no pairs: no-op


@pytest.mark.parametrize("device", DEVICES)
def test_unsupported_head_dim_falls_back(device, caplog):
    case = PagedCase(1, [3, 9], 8, 1, 8, F32, device)
    q = case.randn(2, 2, 8, dtype=F32)
    args = (q, case.k_cache, case.v_cache, case.tables, case.seq_lens, 0.3)
    common._logged.clear()
    with caplog.at_level(logging.INFO, logger=common.logger.name):
        out = ops.paged_decode_attention(*args)
        ops.paged_decode_attention(*args)
    assert_close(out, ref.paged_decode_attention(*args), F32)
    lines = [r for r in caplog.records if "falls back" in r.getMessage()]
    assert len(lines) == 1 and "head_dim 8" in lines[0].getMessage()


def test_cpu_without_interpreter_falls_back(monkeypatch, caplog):
    """CPU tensors with compiled (non-interpreted) kernels take the reference path."""
    monkeypatch.setattr(common, "is_interpreted", lambda kernel: False)
    case = PagedCase(2, [5, 16], 8, 2, 64, F32, "cpu")
    q = case.randn(2, 4, 64, dtype=F32)
    args = (q, case.k_cache, case.v_cache, case.tables, case.seq_lens, 0.125)
    common._logged.clear()
    with caplog.at_level(logging.INFO, logger=common.logger.name):
        out = ops.paged_decode_attention(*args)
    assert torch.equal(out, ref.paged_decode_attention(*args))
    assert any("TRITON_INTERPRET is off" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA tests compile the kernels")
@pytest.mark.skipif(importlib.util.find_spec("triton.backends.nvidia") is None,
                    reason="triton's CUDA backend is not installed")
def test_kernels_compile_for_sm90():
    """The interpreter misses compile-only errors (non-constexpr globals, loop typing): compile
    one configuration of every kernel to a cubin for sm_90, in a process without the interpreter.
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    cmd = [sys.executable, "-m", "localpaged.kernels.triton_compile_check", "--quick"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
