"""The fast paths of one-conversation decode, each against an independent oracle: fused RMSNorm
and table rotary vs transformers' formulas (bitwise), the in-place batch-1 decode attention vs a
plain softmax attention, the CUDA-graph runner's static-buffer path (without capture, on CPU) vs
eager decode, the start-up self-check falling back when a kernel is broken on purpose, and a
chat's blocks kept in one run of the cache after another chat used the blocks there."""

from __future__ import annotations

import logging
import types

import pytest
import torch
from helpers.engine_helpers import greedy, hf_greedy, prompts, token_ids
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from localpaged import LLM
from localpaged.kernels import reference
from localpaged.models.llama import RMSNorm, Rotary, apply_rotary
from localpaged.runner import startup_check
from localpaged.runner.cuda_graphs import (
    StaticDecodeBuffers,
    capture_sizes,
    padded_size,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_bitwise_equals_transformers(dtype):
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 576), (9, 64), (3, 4, 32)]:
        ours, theirs = RMSNorm(shape[-1], 1e-5), LlamaRMSNorm(shape[-1], eps=1e-5)
        w = torch.randn(shape[-1], generator=g)
        ours.weight.data.copy_(w)
        theirs.weight.data.copy_(w)
        ours, theirs = ours.to(dtype), theirs.to(dtype)
        x = (torch.randn(shape, generator=g) * 4).to(dtype)
        assert torch.equal(ours(x), theirs(x))


def test_rotary_table_bitwise_equals_transformers():
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096)
    positions = torch.tensor([0, 1, 17, 300, 1999])
    x = torch.randn(5, 6, 16, generator=torch.Generator().manual_seed(0))
    hf = LlamaRotaryEmbedding(config)
    cos, sin = hf(x, positions[None])
    want, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], cos, sin)
    rotary = Rotary(config, 16)
    got = apply_rotary(x, rotary(positions, x.dtype))
    assert torch.equal(got, want[0].transpose(0, 1))
    assert rotary.table(3000, x.dtype).shape[0] > 3000          # grows past a larger position


def test_contiguous_runs():
    assert reference.contiguous_runs([4, 5, 6, 2, 3, 9]) == [(4, 3), (2, 2), (9, 1)]
    assert reference.contiguous_runs([]) == []


@pytest.mark.parametrize("table", [[0, 1, 2, 3], [7, 3, 4, 1], [5, 6, 2, 3]])
@pytest.mark.parametrize("seq_len", [1, 16, 37, 64])
def test_batch1_decode_in_place_equals_softmax_attention(table, seq_len):
    g = torch.Generator().manual_seed(seq_len)
    block, kv_heads, heads, dim = 16, 2, 6, 8
    k_cache = torch.randn(8, block, kv_heads, dim, generator=g)
    v_cache = torch.randn(8, block, kv_heads, dim, generator=g)
    q = torch.randn(1, heads, dim, generator=g)
    tables = torch.tensor([table + [0, 0]], dtype=torch.int32)
    got = reference.paged_decode_attention(q, k_cache, v_cache, tables,
                                           torch.tensor([seq_len], dtype=torch.int32), 0.3)
    torch.testing.assert_close(got[0], _softmax_attention(q[0], k_cache, v_cache, table, seq_len, 0.3),
                               rtol=1e-5, atol=1e-5)


def _softmax_attention(q, k_cache, v_cache, table, seq_len, scale):
    """Oracle: q [H, D] over the first seq_len tokens of the blocks in `table`, gathered."""
    group = q.shape[0] // k_cache.shape[2]
    keys = k_cache[table].flatten(0, 1)[:seq_len].repeat_interleave(group, 1)
    values = v_cache[table].flatten(0, 1)[:seq_len].repeat_interleave(group, 1)
    probs = (torch.einsum("hd,lhd->hl", q, keys) * scale).softmax(-1)
    return torch.einsum("hl,lhd->hd", probs, values)


@pytest.mark.parametrize("table", [[0, 1, 2, 3], [7, 3, 4, 1]])
def test_decode_one_writes_then_attends_over_runs(table):
    """The runner's batch-1 path: runs computed from the block ids once per step, K/V written
    at the new token's slot, then attention over strided views of the cache."""
    g = torch.Generator().manual_seed(len(table))
    block, kv_heads, heads, dim, seq_len = 16, 2, 6, 8, 37
    k_cache = torch.randn(8, block, kv_heads, dim, generator=g)
    v_cache = torch.randn(8, block, kv_heads, dim, generator=g)
    q, key, value = (torch.randn(1, h, dim, generator=g) for h in (heads, kv_heads, kv_heads))
    runs = reference.decode_runs(table, seq_len, block)
    assert sum(length for _, length in runs) == seq_len
    slot = table[(seq_len - 1) // block] * block + (seq_len - 1) % block
    got = reference.decode_one(q, key, value, k_cache, v_cache, torch.tensor([slot]), runs, 0.3)
    assert torch.equal(k_cache.flatten(0, 1)[slot], key[0]) and torch.equal(v_cache.flatten(0, 1)[slot], value[0])
    torch.testing.assert_close(got[0], _softmax_attention(q[0], k_cache, v_cache, table, seq_len, 0.3),
                               rtol=1e-5, atol=1e-5)


def test_batch1_decode_does_not_depend_on_where_the_blocks_lie():
    """The same tokens in one run of blocks, in scattered blocks, or in blocks out of order give
    bitwise the same attention: where a sequence's blocks lie depends on what else ran, and its
    output must not (docs/architecture.md §2, I12)."""
    g = torch.Generator().manual_seed(5)
    block, kv_heads, heads, dim, seq_len = 16, 2, 6, 8, 45
    k_tokens, v_tokens = (torch.randn(seq_len, kv_heads, dim, generator=g) for _ in range(2))
    q = torch.randn(1, heads, dim, generator=g)
    outs = []
    for table in ([0, 1, 2], [5, 1, 3], [2, 3, 7]):
        k_cache, v_cache = torch.zeros(8, block, kv_heads, dim), torch.zeros(8, block, kv_heads, dim)
        slots = torch.tensor([table[p // block] * block + p % block for p in range(seq_len)])
        k_cache.flatten(0, 1)[slots], v_cache.flatten(0, 1)[slots] = k_tokens, v_tokens
        runs = reference.decode_runs(table, seq_len, block)
        outs.append(reference.decode_one(q, k_tokens[-1:], v_tokens[-1:], k_cache, v_cache,
                                         slots[-1:], runs, 0.3))
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_capture_sizes_and_padding():
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    sizes = capture_sizes(20)
    assert sizes == [1, 2, 4, 8, 16, 20]
    assert [padded_size(b, sizes) for b in (1, 3, 5, 8, 9, 17, 20, 21)] == [1, 4, 8, 8, 16, 20, 20, None]
    with pytest.raises(ValueError, match="max_num_seqs"):
        capture_sizes(0)


def test_static_buffers_pad_rows():
    buf = StaticDecodeBuffers.allocate(4, 5, torch.device("cpu"))
    meta = types.SimpleNamespace(slot_mapping=torch.tensor([7, 40]),
                                 decode_seq_lens=torch.tensor([8, 41], dtype=torch.int32),
                                 decode_block_tables=torch.tensor([[0, 0, 0], [1, 2, 3]], dtype=torch.int32))
    buf.block_tables.fill_(9)                                    # stale rows from an earlier step
    buf.fill(torch.tensor([11, 12]), torch.tensor([7, 40]), meta, 4)
    m = buf.meta(4)
    assert m.slot_mapping.tolist() == [7, 40, -1, -1]
    assert m.decode_seq_lens.tolist() == [8, 41, 1, 1]
    assert m.decode_block_tables.tolist() == [[0, 0, 0, 0, 0], [1, 2, 3, 0, 0], [0] * 5, [0] * 5]
    assert buf.input_ids.tolist() == [11, 12, 0, 0]


def test_graph_runner_static_path_equals_eager(tiny_llama):
    """The graph runner without capture (CPU): same tokens as eager decode, padded sizes used."""
    ps, params = prompts(3, seed=4), [greedy(12), greedy(5), greedy(8)]   # batches 3, 2, 1
    eager = LLM(tiny_llama, num_kv_blocks=64, max_num_seqs=6)
    want = token_ids(eager.generate(ps, params))
    llm = LLM(tiny_llama, num_kv_blocks=64, max_num_seqs=6)
    eng = llm.engine
    runner = startup_check.build_decode_graphs(eng.model, eng.kv_cache.layers, eng.backend, 6,
                                               eng.max_model_len, 16, eng.device, eng.dtype,
                                               capture=False)
    assert runner is not None and runner.sizes == [1, 2, 4, 6]
    eng.runner.graphs = runner
    sizes_run = []
    run = runner.run
    runner.run = lambda ids, pos, meta: sizes_run.append(ids.shape[0]) or run(ids, pos, meta)
    assert token_ids(llm.generate(ps, params)) == want
    assert {3, 2, 1} <= set(sizes_run)                           # 3 padded to 4, 2, 1


def _broken(**overrides) -> types.SimpleNamespace:
    ops = {name: getattr(reference, name) for name in startup_check.KERNELS}
    return types.SimpleNamespace(**(ops | overrides))


def test_kernel_check_names_the_broken_kernel():
    cpu = torch.device("cpu")
    assert startup_check.check_kernels(reference, reference, cpu, torch.float32) is None

    def wrong(q, *args):
        return reference.paged_decode_attention(q, *args) + 0.1

    def raising(*args):
        raise RuntimeError("no kernel image is available")

    msg = startup_check.check_kernels(_broken(paged_decode_attention=wrong), reference, cpu,
                                      torch.float32)
    assert msg.startswith("paged_decode_attention differs")
    msg = startup_check.check_kernels(_broken(copy_blocks=raising), reference, cpu, torch.float32)
    assert msg == "copy_blocks raised RuntimeError: no kernel image is available"


def test_select_backend_falls_back_when_triton_fails(monkeypatch, caplog):
    from localpaged.kernels import triton_ops
    cpu = torch.device("cpu")
    backend, graphs_ok = startup_check.select_backend("triton", cpu, torch.float32, 16, 16,
                                                      force_check=True)
    assert backend.name == "triton" and not graphs_ok           # interpreted kernels pass

    def raising(*args):
        raise RuntimeError("injected failure")
    monkeypatch.setattr(triton_ops, "write_kv", raising)
    with caplog.at_level(logging.WARNING, logger="localpaged.runner.startup_check"):
        backend, graphs_ok = startup_check.select_backend("triton", cpu, torch.float32, 16, 16,
                                                          force_check=True)
    assert backend.name == "torch" and not graphs_ok
    assert [r.getMessage() for r in caplog.records] == [
        "start-up self-check: Triton kernel write_kv raised RuntimeError: injected failure; "
        "using the torch attention backend and eager decode"]
    # without force_check on CPU, no check runs: the requested backend is kept
    assert startup_check.select_backend("torch", cpu, torch.float32, 16, 16)[0].name == "torch"


def test_step_timings_cover_every_phase(tiny_llama):
    from localpaged.runner.model_runner import StepTimings
    llm = LLM(tiny_llama, num_kv_blocks=32)
    eng, timings = llm.engine, StepTimings()
    eng.add_request("r", prompts(1, seed=2)[0], greedy(5))
    outputs = []
    while eng.has_unfinished_requests():
        outputs += eng.step(timings)
    assert timings.steps == 5 and outputs[-1].finished
    assert set(timings.seconds) == {"schedule", "prepare", "forward", "logits", "sample+finish",
                                    "outputs"}
    assert all(v >= 0 for v in timings.per_step_ms().values())


def test_a_chat_after_another_keeps_its_blocks_in_one_run(tiny_llama):
    """Two chats with one system prompt, one after the other: the second reuses the first's
    cached blocks of that prompt, and its own blocks follow them back to back (the first chat's
    cached blocks there move out of the way, still findable), so its batch-1 decode reads one
    run in place. Its tokens are transformers' own."""
    llm = LLM(tiny_llama, num_kv_blocks=64)
    system = prompts(1, seed=3, lo=40, hi=41)[0]              # two full blocks shared
    first, second = system + [5, 6, 7], system + [9, 10, 11, 12]
    reply = llm.generate([first], greedy(40))[0].outputs[0].token_ids
    eng = llm.engine
    eng.add_request("second", second, greedy(40))
    eng.step()
    seq = eng.scheduler.running[0].seqs[0]
    while eng.has_unfinished_requests():
        ids = eng.block_manager.block_ids(seq)
        assert ids == list(range(ids[0], ids[0] + len(ids)))
        eng.step()
    assert seq.output_token_ids == hf_greedy(tiny_llama, second, 40)
    assert eng.scheduler.running == [] and llm.stats().prefix_cache_hits > 0
    follow_up = llm.generate([first + reply[:30] + [8]], greedy(4))[0]   # the first chat goes on
    # all its full blocks still cached, and the tokens it shares with the block after them
    assert follow_up.metrics.num_cached_tokens == len(first) + 30
