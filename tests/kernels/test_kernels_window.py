"""Sliding-window attention in every kernel (window W: the query at position p sees the keys at
p - W < k <= p, transformers' sliding-window mask; 0: full attention).

(a) the torch reference (kernels/reference.py: decode in place, padded and in chunks; prefill)
    equals SDPA over contiguous K/V with an explicit sliding causal mask;
(b) the C++ decode kernel (kernels/cpu_decode.cpp) equals the reference, to test_cpu_decode.py's
    2e-6, and keeps its batch and thread invariance under a window;
(c) the Triton kernels (decode plain and split-K, prefill, and the public functions) equal the
    reference: under TRITON_INTERPRET=1 on CPU (set here and in tests/conftest.py, as
    tests/kernels/test_kernels.py does) and compiled on CUDA;
(d) nothing before a window is read: every kernel's output is the same, and finite, when the
    blocks wholly before each window are filled with NaN and their table entries point at a NaN
    block, at another sequence's block, at an id past the cache or at -1 (`poisoned`).
And `window_start` and `decode_runs(..., start)` against their definitions.

Cases: one sequence and several of mixed lengths (1 token, block multiples, several C++ chunks),
GQA, block sizes 4 and 16; windows of 1 token, smaller than a block, equal to the block size,
not a multiple of it, equal to a context and larger than every context; prefill with a whole
prompt, a chunk starting mid-context and mid-block, one token after a prefix, and query chunks
longer than the window.
"""

import os

import torch  # does not import triton

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"   # tests/conftest.py normally did this already

import logging  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from localpaged.kernels import cpu_ops  # noqa: E402
from localpaged.kernels import reference as ref  # noqa: E402
from localpaged.kernels import triton_common as common  # noqa: E402
from localpaged.kernels import triton_decode as decode  # noqa: E402
from localpaged.kernels import triton_ops as ops  # noqa: E402
from localpaged.kernels import triton_prefill as prefill_mod  # noqa: E402
from localpaged.runner import startup_check  # noqa: E402
from test_kernels import DEVICES, STALE, assert_close, run_interpreted  # noqa: E402

F32 = torch.float32
CPP_TOLERANCE = 2e-6          # tests/kernels/test_cpu_decode.py's
DENSE_TOLERANCE = 1e-5        # the reference against dense SDPA, float32


@pytest.mark.skipif(not STALE, reason="the kernel tests run in this process")
def test_in_fresh_process():
    run_interpreted(__file__)


class WindowCase:
    """Contiguous K/V of each sequence (`keys[i]`, `values[i]`: [len, Hkv, D]) written into a
    paged cache: every sequence its own blocks in shuffled order, block 0 a spare finite block
    (tables are padded with 0, as the model runner pads them) and the last block all NaN."""

    def __init__(self, lens, block_size, kv_heads, head_dim, group, seed=0, dtype=F32,
                 device="cpu"):
        gen = torch.Generator().manual_seed(seed)
        self.lens, self.block_size = list(lens), block_size
        per_seq = [-(-n // block_size) for n in self.lens]
        self.num_blocks = sum(per_seq) + 2
        self.nan_block = self.num_blocks - 1
        ids = (torch.randperm(self.num_blocks - 2, generator=gen) + 1).tolist()
        tables = torch.zeros(len(self.lens), max(per_seq) + 2, dtype=torch.int32)
        for i, n in enumerate(per_seq):
            tables[i, :n] = torch.tensor([ids.pop() for _ in range(n)], dtype=torch.int32)
        shape = (self.num_blocks, block_size, kv_heads, head_dim)
        self.keys = [torch.randn(n, kv_heads, head_dim, generator=gen) for n in self.lens]
        self.values = [torch.randn(n, kv_heads, head_dim, generator=gen) for n in self.lens]
        caches = [torch.randn(shape, generator=gen) for _ in range(2)]
        for cache, per in zip(caches, (self.keys, self.values)):
            cache[self.nan_block] = float("nan")
            flat = cache.view(-1, kv_heads, head_dim)
            for i, n in enumerate(self.lens):
                flat[self.slots(tables[i], n)] = per[i]
        self.k_cache, self.v_cache = (c.to(dtype).to(device) for c in caches)
        self.tables = tables.to(device)
        self.seq_lens = torch.tensor(self.lens, dtype=torch.int32, device=device)
        self.gen, self.heads, self.dtype = gen, kv_heads * group, dtype

    def slots(self, table, n):
        pos = torch.arange(n)
        return table.long().cpu()[pos // self.block_size] * self.block_size + pos % self.block_size

    def randn(self, *shape):
        return torch.randn(shape, generator=self.gen).to(self.dtype).to(self.k_cache.device)

    def poisoned(self, firsts):
        """(k_cache, v_cache, tables) where, for each sequence i, the blocks wholly before
        position firsts[i] are NaN and their table entries, every other one, point at the NaN
        block, at another sequence's block, past the cache or at -1; and how many entries that
        poisoned."""
        k, v, tables = self.k_cache.clone(), self.v_cache.clone(), self.tables.clone()
        count = 0
        for i, first in enumerate(firsts):
            other = int(self.tables[(i + 1) % len(self.lens), 0])
            wrong = [self.nan_block, other, self.num_blocks + 1000, -1]
            for j in range(first // self.block_size):
                k[int(self.tables[i, j])] = float("nan")
                v[int(self.tables[i, j])] = float("nan")
                if j % 2:
                    tables[i, j] = wrong[(j // 2) % len(wrong)]
                count += 1
        return k, v, tables, count


def dense_attention(q, keys, values, q_pos, window, scale):
    """q [T, H, D] at positions q_pos over contiguous keys/values [L, Hkv, D] under the sliding
    causal mask, by SDPA."""
    k_pos = torch.arange(keys.shape[0])[None, :]
    mask = k_pos <= q_pos[:, None]
    if window:
        mask &= k_pos > q_pos[:, None] - window
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1), keys.transpose(0, 1),
                                         values.transpose(0, 1), attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    return out.transpose(0, 1)


def decode_firsts(case, window):
    return [ref.window_start(n, window) for n in case.lens]


def prefill_firsts(case, q_lens, window):
    """Each sequence's first query's window start: where prefill reads from."""
    return [ref.window_start(n - q + 1, window) for n, q in zip(case.lens, q_lens)]


# (lens, block_size, group): one sequence (the reference's in-place path); several of mixed
# lengths (a single token, a block multiple, three C++ chunks), GQA 4.
DECODE_CONFIGS = [([77], 16, 2), ([1, 30, 64, 150], 4, 4)]
# 1 token, under a block, the block size, a context (64, 77 and 150), over every context
WINDOWS = [1, 5, 16, 64, 77, 150, 1000]
HEAD_DIM, KV_HEADS = 64, 2
SCALE = HEAD_DIM ** -0.5


def decode_case(config, device="cpu", dtype=F32):
    lens, block_size, group = config
    case = WindowCase(lens, block_size, KV_HEADS, HEAD_DIM, group, seed=block_size,
                      dtype=dtype, device=device)
    return case, case.randn(len(lens), case.heads, HEAD_DIM)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("config", DECODE_CONFIGS)
@pytest.mark.parametrize("window", WINDOWS)
def test_reference_decode_equals_dense_and_reads_only_the_window(config, window, chunked,
                                                                  monkeypatch):
    if chunked:       # several sequences go through the chunk loop, one through the padded path
        monkeypatch.setattr(ref, "DECODE_CHUNK", 2)
        monkeypatch.setattr(ref, "back_to_back", lambda cache: False)
    case, q = decode_case(config)
    got = ref.paged_decode_attention(q, case.k_cache, case.v_cache, case.tables, case.seq_lens,
                                     SCALE, window)
    for i, n in enumerate(case.lens):
        want = dense_attention(q[i:i + 1], case.keys[i], case.values[i], torch.tensor([n - 1]),
                               window, SCALE)
        assert (got[i:i + 1] - want).abs().max().item() < DENSE_TOLERANCE
    k, v, tables, _ = case.poisoned(decode_firsts(case, window))
    assert torch.equal(ref.paged_decode_attention(q, k, v, tables, case.seq_lens, SCALE, window),
                       got)


# (lens, q_lens): a whole prompt, a chunk of 25 from position 45 (mid-context, mid-block), one
# token after 8 cached, a whole prompt; windows 6 and 30 are shorter than the query chunks.
PREFILL_LENS, PREFILL_Q_LENS = [40, 70, 9, 33], [40, 25, 1, 33]
PREFILL_WINDOWS = [1, 6, 16, 30, 100]


def prefill_case(block_size, device="cpu", dtype=F32):
    case = WindowCase(PREFILL_LENS, block_size, KV_HEADS, HEAD_DIM, 2, seed=block_size + 1,
                      dtype=dtype, device=device)
    starts = torch.tensor([0] + PREFILL_Q_LENS).cumsum(0).to(torch.int32).to(device)
    return case, case.randn(int(starts[-1]), case.heads, HEAD_DIM), starts


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("window", PREFILL_WINDOWS)
def test_reference_prefill_equals_dense_and_reads_only_the_window(block_size, window):
    case, q, starts = prefill_case(block_size)
    got = ref.paged_prefill_attention(q, case.k_cache, case.v_cache, case.tables, starts,
                                      case.seq_lens, SCALE, window)
    for i, (n, q_len) in enumerate(zip(case.lens, PREFILL_Q_LENS)):
        lo, hi = int(starts[i]), int(starts[i + 1])
        want = dense_attention(q[lo:hi], case.keys[i], case.values[i],
                               torch.arange(n - q_len, n), window, SCALE)
        assert (got[lo:hi] - want).abs().max().item() < DENSE_TOLERANCE
    k, v, tables, _ = case.poisoned(prefill_firsts(case, PREFILL_Q_LENS, window))
    assert torch.equal(ref.paged_prefill_attention(q, k, v, tables, starts, case.seq_lens, SCALE,
                                                   window), got)


def test_window_start_is_the_first_key_the_last_query_sees():
    for seq_len in (1, 2, 15, 16, 17, 100):
        assert ref.window_start(seq_len, 0) == 0
        for window in (1, 2, 15, 16, 17, 100, 1000):
            last = seq_len - 1
            assert ref.window_start(seq_len, window) == min(
                k for k in range(seq_len) if k > last - window)


def test_decode_runs_cover_the_window_and_skip_what_is_before_it():
    gen = torch.Generator().manual_seed(0)
    block_size = 4
    for seq_len in (1, 4, 5, 23, 40):
        num = -(-seq_len // block_size)
        table = (torch.randperm(6, generator=gen)[:num] * 2).tolist()   # a few runs of one
        table[num // 2:] = list(range(20, 20 + num - num // 2))         # and one long run
        for start in range(seq_len):
            # entries before start's block are not looked at: None would break the arithmetic
            ids = [None] * (start // block_size) + table[start // block_size:] + [99]
            runs = ref.decode_runs(ids, seq_len, block_size, start)
            slots = [s for first, length in runs for s in range(first, first + length)]
            assert slots == [table[p // block_size] * block_size + p % block_size
                             for p in range(start, seq_len)]
        assert ref.decode_runs(table, seq_len, block_size) == ref.decode_runs(
            table, seq_len, block_size, 0)


# ---- the C++ decode kernel -----------------------------------------------------------------

@pytest.fixture(scope="module")
def kernel(cpu_ext):
    return cpu_ext.paged_decode_attention


@pytest.mark.parametrize("config", DECODE_CONFIGS)
@pytest.mark.parametrize("window", WINDOWS)
def test_cpp_decode_equals_the_reference_and_reads_only_the_window(kernel, config, window):
    case, q = decode_case(config)
    args = (q, case.k_cache, case.v_cache, case.tables, case.seq_lens, SCALE, window)
    got = kernel(*args)
    assert (got - ref.paged_decode_attention(*args)).abs().max().item() < CPP_TOLERANCE
    k, v, tables, _ = case.poisoned(decode_firsts(case, window))
    poisoned = kernel(q, k, v, tables, case.seq_lens, SCALE, window)
    assert torch.isfinite(poisoned).all() and torch.equal(poisoned, got)
    assert torch.equal(cpu_ops.paged_decode_attention(*args), got)     # the cpu backend's


def test_cpp_window_zero_is_full_attention(kernel):
    case, q = decode_case(DECODE_CONFIGS[1])
    args = (q, case.k_cache, case.v_cache, case.tables, case.seq_lens, SCALE)
    assert torch.equal(kernel(*args, 0), kernel(*args))
    assert torch.equal(kernel(*args, 1000), kernel(*args))     # a window past every context


def test_cpp_window_result_is_the_same_alone_batched_and_on_any_thread_count(kernel):
    case, q = decode_case(([150, 17, 130, 64, 200], 16, 3))
    args = (case.k_cache, case.v_cache, case.tables, case.seq_lens)
    batched = kernel(q, *args, SCALE, 70)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernel(q, *args, SCALE, 70), batched)
    finally:
        torch.set_num_threads(threads)
    for i in range(len(case.lens)):
        alone = kernel(q[i:i + 1], case.k_cache, case.v_cache, case.tables[i:i + 1],
                       case.seq_lens[i:i + 1], SCALE, 70)
        assert torch.equal(alone[0], batched[i])


def test_cpp_window_checks_the_entries_it_reads(kernel):
    case, q = decode_case(DECODE_CONFIGS[0])           # 77 tokens in blocks of 16
    args = (q, case.k_cache, case.v_cache)
    tables = case.tables.clone()
    tables[0, 0] = case.num_blocks + 5                 # before a window of 20: never read
    kernel(*args, tables, case.seq_lens, SCALE, 20)
    tables[0, 4] = case.num_blocks + 5                 # inside it: refused
    with pytest.raises(RuntimeError, match="outside the cache"):
        kernel(*args, tables, case.seq_lens, SCALE, 20)
    with pytest.raises(RuntimeError, match="negative"):
        kernel(*args, case.tables, case.seq_lens, SCALE, -1)


# ---- Triton ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["plain", "split"])
@pytest.mark.parametrize("config", DECODE_CONFIGS)
@pytest.mark.parametrize("window", WINDOWS)
def test_triton_decode_equals_the_reference_and_reads_only_the_window(device, variant, config,
                                                                      window):
    case, q = decode_case(config, device)
    if variant == "plain":
        def run(k, v, tables):
            return decode.decode_plain(q, k, v, tables, case.seq_lens, SCALE, window=window)
    else:    # partitions of 16 (tiles of 16): windows start inside, at and across partitions
        def run(k, v, tables):
            return decode.decode_split_k(q, k, v, tables, case.seq_lens, SCALE, partition_size=16,
                                         tile_n=16, window=window)
    got = run(case.k_cache, case.v_cache, case.tables)
    assert_close(got, ref.paged_decode_attention(q, case.k_cache, case.v_cache, case.tables,
                                                 case.seq_lens, SCALE, window), F32)
    k, v, tables, _ = case.poisoned(decode_firsts(case, window))
    assert torch.equal(run(k, v, tables), got)


def test_split_k_partitions_cover_any_window():
    """num_partitions: any W consecutive positions lie in that many partitions of P."""
    for part in (16, 256):
        for window in (1, 15, 16, 17, 255, 256, 257, 600):
            worst = max((s + window - 1) // part - s // part + 1 for s in range(2 * part))
            assert decode.num_partitions(10 ** 6, part, window) >= worst
            assert decode.num_partitions(10 ** 6, part, window) <= worst + 1
        assert decode.num_partitions(10 * part, part, 10 ** 6) == 10     # the table's bound


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("block_q", [4, None])
@pytest.mark.parametrize("window", PREFILL_WINDOWS)
def test_triton_prefill_equals_the_reference_and_reads_only_the_window(device, block_size,
                                                                       block_q, window):
    case, q, starts = prefill_case(block_size, device)

    def run(k, v, tables):
        return prefill_mod.prefill(q, k, v, tables, starts, case.seq_lens, SCALE,
                                   block_q=block_q, window=window)
    got = run(case.k_cache, case.v_cache, case.tables)
    assert_close(got, ref.paged_prefill_attention(q, case.k_cache, case.v_cache, case.tables,
                                                  starts, case.seq_lens, SCALE, window), F32)
    k, v, tables, _ = case.poisoned(prefill_firsts(case, PREFILL_Q_LENS, window))
    assert torch.equal(run(k, v, tables), got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_public_functions_take_the_window(device, dtype, caplog):
    """ops.paged_*_attention with a window run their kernels (no fallback line), in 16-bit;
    decode with one long sequence takes split-K (window 600 of 900 tokens, 256-token
    partitions from the window's), beside a short one."""
    case = WindowCase([900, 20], 16, KV_HEADS, HEAD_DIM, 4, seed=5, dtype=dtype, device=device)
    assert decode.use_split_k(2, KV_HEADS, 600, case.k_cache.device)
    q = case.randn(2, case.heads, HEAD_DIM)
    k, v, tables, count = case.poisoned(decode_firsts(case, 600))
    assert count > 0
    common._logged.clear()
    with caplog.at_level(logging.INFO, logger=common.logger.name):
        got = ops.paged_decode_attention(q, k, v, tables, case.seq_lens, SCALE, 600)
        starts = torch.tensor([0, 30, 50], dtype=torch.int32, device=device)
        q_pre = case.randn(50, case.heads, HEAD_DIM)
        got_pre = ops.paged_prefill_attention(q_pre, case.k_cache, case.v_cache, case.tables,
                                              starts, case.seq_lens, SCALE, 24)
    assert not [r for r in caplog.records if "falls back" in r.getMessage()]
    assert_close(got, ref.paged_decode_attention(q, case.k_cache, case.v_cache, case.tables,
                                                 case.seq_lens, SCALE, 600), dtype)
    assert_close(got_pre, ref.paged_prefill_attention(q_pre, case.k_cache, case.v_cache,
                                                      case.tables, starts, case.seq_lens, SCALE,
                                                      24), dtype)


def test_startup_check_names_a_kernel_that_ignores_the_window():
    """The start-up check (runner/startup_check.py) runs the attention kernels with a window
    too: a decode kernel attending to the whole context fails it."""
    cpu = torch.device("cpu")
    assert startup_check.check_kernels(ref, ref, cpu, F32) is None

    def full(q, k_cache, v_cache, tables, lens, scale, window=0):
        return ref.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
    ops_ = types.SimpleNamespace(**{name: getattr(ref, name) for name in startup_check.KERNELS})
    ops_.paged_decode_attention = full
    assert "paged_decode_attention differs" in startup_check.check_kernels(ops_, ref, cpu, F32)


# ---- runs of two-way attention (Gemma 3's image tokens) ------------------------------------
# Per sequence of PREFILL_LENS / PREFILL_Q_LENS, runs [lo, hi) inside its new tokens: none; one
# inside the chunk of 25 from position 45 (one run ending at the chunk's end, one ending in the
# middle of a BLOCK_Q tile); none for the single token; one of 12 from position 3.
OPEN_RUNS = [[], [(47, 55), (60, 70)], [], [(3, 15)]]


def dense_open(q, keys, values, q_pos, runs, window, scale):
    """dense_attention's mask OR each run both ways, AND the window (transformers' Gemma 3)."""
    k_pos = torch.arange(keys.shape[0])[None, :]
    qp = q_pos[:, None]
    mask = k_pos <= qp
    for lo, hi in runs:
        mask |= (qp >= lo) & (qp < hi) & (k_pos >= lo) & (k_pos < hi)
    if window:
        mask &= k_pos > qp - window
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1), keys.transpose(0, 1),
                                         values.transpose(0, 1), attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    return out.transpose(0, 1)


@pytest.mark.parametrize("window", [0, 6, 100])
def test_reference_prefill_opens_runs_both_ways(window):
    case, q, starts = prefill_case(16)
    got = ref.paged_prefill_attention(q, case.k_cache, case.v_cache, case.tables, starts,
                                      case.seq_lens, SCALE, window, open_runs=OPEN_RUNS)
    causal = ref.paged_prefill_attention(q, case.k_cache, case.v_cache, case.tables, starts,
                                         case.seq_lens, SCALE, window)
    for i, (n, q_len) in enumerate(zip(case.lens, PREFILL_Q_LENS)):
        lo, hi = int(starts[i]), int(starts[i + 1])
        want = dense_open(q[lo:hi], case.keys[i], case.values[i], torch.arange(n - q_len, n),
                          OPEN_RUNS[i], window, SCALE)
        assert (got[lo:hi] - want).abs().max().item() < DENSE_TOLERANCE
        assert torch.equal(got[lo:hi], causal[lo:hi]) == (not OPEN_RUNS[i] or window == 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_q", [4, None])
@pytest.mark.parametrize("window", [0, 6, 100])
def test_triton_prefill_opens_runs_as_the_reference(device, block_q, window):
    case, q, starts = prefill_case(16, device)
    got = prefill_mod.prefill(q, case.k_cache, case.v_cache, case.tables, starts, case.seq_lens,
                              SCALE, block_q=block_q, window=window, open_runs=OPEN_RUNS)
    assert_close(got, ref.paged_prefill_attention(q, case.k_cache, case.v_cache, case.tables,
                                                  starts, case.seq_lens, SCALE, window,
                                                  open_runs=OPEN_RUNS), F32)
    public = ops.paged_prefill_attention(q, case.k_cache, case.v_cache, case.tables, starts,
                                         case.seq_lens, SCALE, window, open_runs=OPEN_RUNS)
    assert torch.equal(public, got) or block_q is not None
