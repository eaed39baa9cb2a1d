"""The disk tier through the engine's public boundary and where it is shown: AsyncEngine.prefetch
reads a conversation back in the background before its request is sent (the request's prefix
then counts as from disk, its tokens those of an engine without the tier), clear_kv_disk empties
the store, and the per-request split, /metrics, the engine panel and the reply footer show it."""

from __future__ import annotations

import time

from helpers.engine_helpers import greedy, prompts

from localpaged import LLM
from localpaged.api.metrics import MetricsRecorder
from localpaged.engine.async_engine import AsyncEngine
from localpaged.ui.engine_panel.logic import KvSnapshot
from localpaged.ui.engine_panel.view import render_panel
from localpaged.ui.render import fmt_stats


def wait_for(cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_prefetch_clear_and_what_is_shown(tiny_llama, tmp_path):
    first = prompts(1, seed=41, lo=150, hi=151)[0]
    plain = LLM(tiny_llama, num_kv_blocks=64)
    reply = plain.generate([first], greedy(8))[0].outputs[0].token_ids
    second = first + reply + [7, 8, 9]
    want = plain.generate([second], greedy(8))[0].outputs[0].token_ids

    writer = LLM(tiny_llama, num_kv_blocks=64, kv_disk_dir=str(tmp_path))
    writer.generate([first], greedy(8))
    writer.engine.kv_disk.flush()

    engine = LLM(tiny_llama, num_kv_blocks=64, kv_disk_dir=str(tmp_path), debug_checks=True).engine
    served = AsyncEngine(engine)
    try:
        served.prefetch(first + reply)                        # the tab opened
        blocks = (len(first) + len(reply)) // engine.config.block_size
        wait_for(lambda: served.stats().kv_disk.hits == blocks)
        wait_for(lambda: served.cached_prefix_tokens(second) == blocks * engine.config.block_size)
        out = list(served.submit(second, greedy(8)))[-1]
        assert out.outputs[0].token_ids == want
        m = out.metrics
        assert m.num_disk_tokens == m.num_cached_tokens == blocks * engine.config.block_size
        stats = served.stats()
        assert stats.prefix_cache_disk_hits == m.num_disk_tokens

        text = MetricsRecorder().render(stats)
        assert f"localpaged_kv_disk_blocks {float(stats.kv_disk.num_blocks)}" in text
        assert f"localpaged_prefix_cache_disk_hits_total {float(m.num_disk_tokens)}" in text
        assert f"localpaged_kv_disk_reads_total {float(blocks)}" in text
        panel = render_panel(KvSnapshot(True, stats=stats))
        assert f"Disk tier: {stats.kv_disk.num_blocks} blocks" in panel
        assert f"{blocks} read back" in panel
        footer = fmt_stats({"prefix_tokens_reused": m.num_cached_tokens,
                            "prefix_tokens_from_disk": m.num_disk_tokens})
        assert footer == f"prefill skipped: {m.num_cached_tokens} tokens ({m.num_disk_tokens} from disk)"
        assert "from disk" not in fmt_stats({"prefix_tokens_reused": 16, "prefix_tokens_from_disk": 0})

        assert stats.kv_disk.num_blocks > 0
        served.clear_kv_disk()
        wait_for(lambda: served.stats().kv_disk.num_blocks == 0)
        assert not any(tmp_path.rglob("*.kv"))
    finally:
        served.shutdown()


def test_no_disk_tier_shows_nothing(tiny_llama):
    engine = LLM(tiny_llama, num_kv_blocks=64).engine
    assert engine.prefetch([1, 2, 3] * 20) == 0
    stats = engine.stats()
    assert "kv_disk" not in MetricsRecorder().render(stats)
    assert "Disk tier" not in render_panel(KvSnapshot(True, stats=stats))
