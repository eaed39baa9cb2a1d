"""What runs when a user passes no engine flag, each against a rule computed here:

- the automatic KV-cache size (num_kv_blocks=None): floor(budget / bytes per block), the budget
  being kv_cache_memory_fraction of the available memory (monkeypatched to a stated number), on
  CPU at most max_kv_cache_gb, the bytes per block computed from the model's config.json; a
  budget that holds no block is refused;
- the CUDA-graph runner's capture and replay, on CPU with a fake CUDA (a captured graph replays
  the forward it recorded, on the same static buffers): which sizes are captured and how, a
  decode batch replayed at the next captured size, everything else eager, and the start-up check
  falling back to eager decode, with one log line, when a replay (or a kernel) disagrees;
- a config with a sliding window keeps its whole context (its layers attend over the window);
- the heap trim after loading (glibc's malloc_trim): RSS in a subprocess with and without it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import pytest
import torch
from helpers.engine_helpers import greedy, hf_greedy, prompts, token_ids
from helpers.tiny_models import build

from localpaged import LLM
from localpaged.engine import assembly
from localpaged.models.attention import AttentionMetadata
from localpaged.quant import memory as memory_module
from localpaged.runner import startup_check
from localpaged.runner.cuda_graphs import DecodeGraphRunner

MiB = 2**20
BLOCK = 16


# ---- automatic KV-cache size ---------------------------------------------------------------------
def bytes_per_block(path: str, dtype_bytes: int, block_size: int = BLOCK) -> int:
    """K and V of one block, every layer, from the model's config.json."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * block_size * cfg["num_key_value_heads"] * head_dim \
        * dtype_bytes


@pytest.fixture
def available(monkeypatch):
    """Set the memory the engine sees as available (bytes); records the devices asked about.
    Every figure below keeps the budget small even where a cap it tests were ignored."""
    asked = []

    def set_to(nbytes: int) -> list:
        monkeypatch.setattr(assembly, "available_memory",
                            lambda device: asked.append(device.type) or nbytes)
        return asked
    return set_to


@pytest.mark.parametrize("dtype, dtype_bytes", [("float32", 4), ("bfloat16", 2)])
@pytest.mark.parametrize("memory, options, budget", [
    (100 * MiB + 12345, {}, 0.3 * (100 * MiB + 12345)),       # the defaults: 0.3, cap 2 GB
    (40 * MiB, {"max_kv_cache_gb": 0.005}, 0.005 * 2**30),      # the CPU cap binds
    (10 * MiB, {"kv_cache_memory_fraction": 0.5, "max_kv_cache_gb": None}, 5 * MiB),
], ids=["defaults", "cap", "fraction-no-cap"])
def test_automatic_kv_cache_size(tiny_llama, available, dtype, dtype_bytes, memory, options,
                                 budget):
    asked = available(memory)
    llm = LLM(tiny_llama, dtype=dtype, **options)
    want = int(budget // bytes_per_block(tiny_llama, dtype_bytes))
    stats = llm.stats()
    assert asked == ["cpu"] and stats.num_blocks == want
    assert llm.engine.kv_cache.device_blocks.shape[2] == want          # what is allocated
    assert llm.engine.context_limit() == min(1024, want * BLOCK)


def test_swap_space_size(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=8, preemption_mode="swap", swap_space_gb=0.001)
    assert llm.stats().num_cpu_blocks == int(0.001 * 2**30 // bytes_per_block(tiny_llama, 4))


@pytest.mark.parametrize("memory, options, names", [
    (4096, {}, "kv_cache_memory_fraction=0.3 of 0.0 MiB available, capped at max_kv_cache_gb=2.0"),
    (16 * MiB, {"max_kv_cache_gb": 1e-6}, "capped at max_kv_cache_gb=1e-06"),
], ids=["memory", "cap"])
def test_a_budget_without_one_block_is_refused(tiny_llama, available, memory, options, names):
    available(memory)
    per_block = bytes_per_block(tiny_llama, 4)
    with pytest.raises(ValueError) as err:
        LLM(tiny_llama, **options)
    assert f"does not hold one block of {per_block:,} bytes" in str(err.value)
    assert names in str(err.value) and "num_kv_blocks" in str(err.value)


# ---- CUDA graphs, with a fake CUDA ---------------------------------------------------------------
class FakeGraph:
    """A captured graph: replay runs again the forwards recorded while it was captured, on the
    same tensors (the static buffers), and writes the captured output in place."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.recorded, self.pool_handle, self.pool_arg = cuda, [], None, None

    def pool(self):
        return self.pool_handle

    def replay(self) -> None:
        for runner, size, out in self.recorded:
            self.cuda.replayed.append(size)
            out.copy_(self.cuda.forward(runner, size) + self.cuda.skew)


class FakeCuda:
    """torch.cuda's graph API on CPU. `skew` is added to every replay (a graph that disagrees
    with eager); `capture_error` is raised by a capture."""

    def __init__(self, monkeypatch) -> None:
        self.captured: list[FakeGraph] = []          # in capture order
        self.sizes_captured: list[int] = []
        self.replayed: list[int] = []
        self.eager: list[int] = []                   # forwards outside any capture
        self.skew = 0.0
        self.capture_error: Exception | None = None
        self.recording: FakeGraph | None = None
        self.forward = DecodeGraphRunner._forward

        def forward(runner, size):
            out = self.forward(runner, size)
            if self.recording is None:
                self.eager.append(size)
            else:
                self.recording.recorded.append((runner, size, out))
                self.sizes_captured.append(size)
            return out

        monkeypatch.setattr(DecodeGraphRunner, "_forward", forward)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: FakeGraph(self))
        monkeypatch.setattr(torch.cuda, "graph", self.graph)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)

    @contextmanager
    def graph(self, graph: FakeGraph, pool=None):
        if self.capture_error is not None:
            raise self.capture_error
        graph.pool_arg, graph.pool_handle = pool, pool if pool is not None else object()
        self.recording = graph
        try:
            yield
        finally:
            self.recording = None
        self.captured.append(graph)


@pytest.fixture
def fake_cuda(monkeypatch):
    return FakeCuda(monkeypatch)


@pytest.fixture
def graphs_on_cpu(monkeypatch):
    """The engine's start-up builds decode graphs on CPU (select_backend says they may)."""
    real = startup_check.select_backend
    monkeypatch.setattr(startup_check, "select_backend",
                        lambda *args, **kwargs: (real(*args, **kwargs)[0], True))


def _padded(batch: int, sizes: list[int]) -> int:
    return min(s for s in sizes if s >= batch)


def test_graphs_captured_largest_first_in_one_pool_and_replayed_padded(
        tiny_llama, fake_cuda, graphs_on_cpu):
    """Start-up captures 1, 2, 4 and max_num_seqs=6, largest first, each after an eager
    warm-up and sharing the first one's memory pool, without writing the KV cache; the
    self-check replays size 1. Then every decode-only step replays the smallest captured size
    holding its batch and every step with a prompt runs eagerly; the tokens are transformers'."""
    llm = LLM(tiny_llama, num_kv_blocks=64, max_num_seqs=6, record_steps=True)
    runner = llm.engine.runner.graphs
    assert isinstance(runner, DecodeGraphRunner) and sorted(runner.graphs) == [1, 2, 4, 6]
    assert fake_cuda.sizes_captured == [6, 4, 2, 1]
    assert fake_cuda.eager[:4] == [6, 4, 2, 1]                   # a warm-up before each capture
    first = fake_cuda.captured[0]
    assert first.pool_arg is None
    assert all(g.pool_arg is first.pool_handle for g in fake_cuda.captured[1:])
    assert not llm.engine.kv_cache.device_blocks.any()          # capture wrote no K/V
    assert fake_cuda.replayed == [1]                             # the start-up self-check
    fake_cuda.replayed.clear()
    ps, params = prompts(3, seed=4), [greedy(12), greedy(5), greedy(8)]   # batches 3, 2, 1
    got = token_ids(llm.generate(ps, params))
    assert got == [[hf_greedy(tiny_llama, p, sp.max_tokens)] for p, sp in zip(ps, params)]
    decode_steps = [r for r in llm.engine.step_records if all(s.num_tokens == 1 for s in r.seqs)]
    assert fake_cuda.replayed == [_padded(len(r.seqs), [1, 2, 4, 6]) for r in decode_steps]
    assert {3, 2, 1} <= {len(r.seqs) for r in decode_steps} and 4 in fake_cuda.replayed


def test_graph_runner_runs_only_what_fits(tiny_llama, fake_cuda):
    """can_run: decode-only batches up to the largest captured size whose block tables fit the
    static width; a prompt in the batch, a larger batch or a wider table runs eagerly."""
    eng = LLM(tiny_llama, num_kv_blocks=64).engine
    runner = DecodeGraphRunner(eng.model, eng.kv_cache.layers, eng.backend, [1, 2, 4], 64,
                               BLOCK, eng.device, eng.dtype)
    ints = dict(dtype=torch.int32)

    def meta(decodes: int, tokens: int, width: int = 4) -> AttentionMetadata:
        return AttentionMetadata(torch.zeros(tokens, dtype=torch.long), decodes,
                                 torch.zeros(decodes, width, **ints), torch.ones(decodes, **ints),
                                 torch.zeros(0, width, **ints), torch.zeros(1, **ints),
                                 torch.zeros(0, **ints))

    assert runner.max_blocks == 4
    assert runner.can_run(meta(3, 3), 3) and runner.can_run(meta(4, 4), 4)
    assert not runner.can_run(meta(2, 7), 7)                     # a prompt beside the decodes
    assert not runner.can_run(meta(5, 5), 5)                     # larger than every size
    assert not runner.can_run(meta(2, 2, width=5), 2)            # longer than max_model_len
    assert not runner.can_run(meta(0, 0), 0)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == startup_check.__name__ and r.levelno == logging.WARNING]


@pytest.mark.parametrize("fault", ["replay differs", "capture raises"])
def test_start_up_check_falls_back_to_eager_with_one_line(tiny_llama, fake_cuda, graphs_on_cpu,
                                                          caplog, fault):
    if fault == "replay differs":
        fake_cuda.skew = 0.5
        want = "start-up self-check: CUDA graph replay differs from eager by 0.5 (tolerance "
    else:
        fake_cuda.capture_error = RuntimeError("operation not permitted when stream is capturing")
        want = ("start-up self-check: CUDA graph capture raised RuntimeError: operation not "
                "permitted when stream is capturing; decoding eagerly")
    with caplog.at_level(logging.WARNING, logger=startup_check.__name__):
        llm = LLM(tiny_llama, num_kv_blocks=64, max_num_seqs=4)
    lines = _warnings(caplog)
    assert len(lines) == 1 and lines[0].startswith(want) and lines[0].endswith("decoding eagerly")
    assert llm.engine.runner.graphs is None
    p = prompts(1, seed=9)[0]
    assert token_ids(llm.generate([p], greedy(6))) == [[hf_greedy(tiny_llama, p, 6)]]


def test_start_up_check_falls_back_when_a_kernel_disagrees(monkeypatch, caplog):
    """A Triton kernel that runs but returns wrong numbers: the torch backend, eager decode, one
    line naming the kernel and by how much it differs."""
    from localpaged.kernels import reference, triton_ops

    def off_by_a_tenth(q, *args, **kwargs):
        return reference.paged_decode_attention(q, *args, **kwargs) + 0.1
    monkeypatch.setattr(triton_ops, "paged_decode_attention", off_by_a_tenth)
    cpu = torch.device("cpu")
    with caplog.at_level(logging.WARNING, logger=startup_check.__name__):
        backend, graphs_ok = startup_check.select_backend("triton", cpu, torch.float32, 16, 16,
                                                          force_check=True)
    assert backend.name == "torch" and not graphs_ok
    lines = _warnings(caplog)
    assert len(lines) == 1 and lines[0].startswith(
        "start-up self-check: Triton kernel paged_decode_attention differs from the torch "
        "reference by 0.1 (tolerance 0.001); using the torch attention backend")


# ---- sliding window ------------------------------------------------------------------------------
def _variant(tiny_root: str, tmp_path, kind: str, **config) -> str:
    """A copy of tests/tiny_models' `kind` with config.json fields changed."""
    path = str(tmp_path / f"{kind}-variant")
    shutil.copytree(build(kind, tiny_root), path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg | config, f)
    return path


def test_a_sliding_window_does_not_cap_the_context(tiny_root, tmp_path):
    """With a window (48) smaller than max_position_embeddings, the context stays the model's
    (max_model_len caps it as for any model), and a prompt and reply three windows long are
    transformers' own tokens (its sliding-window Mistral)."""
    path = _variant(tiny_root, tmp_path, "mistral", sliding_window=48)
    llm = LLM(path, num_kv_blocks=64)
    assert llm.engine.max_model_len == llm.engine.context_limit() == 1024
    p = prompts(1, seed=3, lo=100, hi=101)[0]
    out = llm.generate([p], greedy(48))[0].outputs[0]
    assert out.token_ids == hf_greedy(path, p, 48)
    assert LLM(path, num_kv_blocks=64, max_model_len=32).engine.max_model_len == 32


@pytest.mark.parametrize("config, context", [
    ({"sliding_window": 48, "use_sliding_window": False}, 1024),  # the window is switched off
    ({"sliding_window": 4096}, 1024),                             # wider than the positions
    ({"sliding_window": None}, 1024),
], ids=["switched-off", "wider", "none"])
def test_the_context_without_a_binding_window(tiny_root, tmp_path, config, context):
    path = _variant(tiny_root, tmp_path, "llama-gqa", **config)
    assert LLM(path, num_kv_blocks=64).engine.max_model_len == context


# ---- heap trim -----------------------------------------------------------------------------------
TRIM_WORKLOAD = textwrap.dedent("""
    import ctypes, importlib.util, os, sys
    spec = importlib.util.spec_from_file_location("memory", sys.argv[2])   # quant/memory.py alone
    memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory)
    if sys.argv[1] == "no-op":
        memory._malloc_trim = lambda: None              # trim_heap then trims nothing
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    PAGE = os.sysconf("SC_PAGE_SIZE")
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE
    def touched(n):                                     # what a CPU tensor is: malloc'd, written
        p = libc.malloc(n)
        ctypes.memset(p, 1, n)
        return p
    libc.free(touched(8 << 20))                         # a freed mmapped chunk: glibc raises its
                                                        # mmap threshold, so what follows is heap
    base = rss()
    keep, temporaries = [], []
    for _ in range(64):                                 # loading: few-MB temporaries between
        temporaries.append(touched(3 << 20))            # long-lived pieces
        keep.append(touched(16 << 10))
    for p in temporaries:
        libc.free(p)
    held = rss() - base
    memory.trim_heap()
    print(held, rss() - base)
""")


def _rss_after(*modes: str) -> list[tuple[int, int]]:
    """(RSS held by the freed temporaries, RSS after trim_heap) per mode, one process each."""
    procs = [subprocess.Popen([sys.executable, "-c", TRIM_WORKLOAD, mode, memory_module.__file__],
                              stdout=subprocess.PIPE, text=True) for mode in modes]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        held, after = map(int, out.split())
        results.append((held, after))
    return results


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_trim_heap_returns_freed_memory_to_the_os():
    """192 MB of freed few-MB temporaries stay resident (fragmented by the small tensors kept
    between them) until trim_heap; with the trim a no-op they stay."""
    (held, trimmed), (held_noop, kept) = _rss_after("trim", "no-op")
    assert held > 150 * MiB and held_noop > 150 * MiB            # freed, still resident
    assert trimmed < 20 * MiB                                    # given back
    assert kept > 150 * MiB                                      # without the trim: not


def test_loading_ends_with_a_trim(tiny_llama, monkeypatch):
    from localpaged.runner import loader
    calls = []
    monkeypatch.setattr(loader, "trim_heap", lambda: calls.append("trim"))
    loaded = loader.load(tiny_llama, torch.device("cpu"), torch.float32, None, "none")
    assert loaded.model is not None and calls == ["trim"]
