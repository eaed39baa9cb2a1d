"""/metrics (localpaged/api/metrics.py) read back with prometheus_client's own parser.

The oracle is the input: request metrics recorded by hand and an EngineStats built by hand must
come back, through the exposition text and `text_string_to_metric_families`, as the same numbers
(histogram buckets counted independently here). Two apps in one process keep separate registries.
"""

from __future__ import annotations

import bisect

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localpaged import LLM, SamplingParams
from localpaged.api.metrics import TTFT_BUCKETS, MetricsRecorder
from localpaged.api.server import build_app, make_server, start_in_thread
from localpaged.engine.async_engine import AsyncEngine
from localpaged.engine.outputs import EngineStats, RequestMetrics


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, for every sample the parser finds."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def stats(**kw) -> EngineStats:
    base = dict(num_blocks=64, block_size=16, blocks_in_use=10, blocks_cached=4, blocks_free=50,
                blocks_shared=3, blocks_without_sharing=13, tokens_in_use=150,
                prefix_cache_queries=96, prefix_cache_hits=32, num_preemptions=2,
                num_swapped_out=0, num_cpu_blocks=0, cpu_blocks_in_use=0, num_running=2,
                num_waiting=1, num_swapped=0, draft_tokens=40, accepted_draft_tokens=29)
    base.update(kw)
    return EngineStats(**base)


def test_recorder_exposition_parses_to_recorded_values():
    rec = MetricsRecorder()
    # (arrival, first token, finished, cached, generated), reason, prompt tokens
    runs = [(RequestMetrics(100.0, 100.02, 101.0, 16, 11), "length", 40),
            (RequestMetrics(200.0, 200.7, 202.7, 0, 5), "stop", 7),
            (RequestMetrics(300.0, None, 300.1, 0, 0), "abort", 3)]
    for m, reason, n_prompt in runs:
        rec.record_request(m, reason, n_prompt)
    got = samples(rec.render(stats()))

    assert got[("localpaged_kv_blocks", (("state", "total"),))] == 64
    assert got[("localpaged_kv_blocks", (("state", "in_use"),))] == 10
    assert got[("localpaged_kv_blocks", (("state", "cached"),))] == 4
    assert got[("localpaged_kv_blocks", (("state", "free"),))] == 50
    assert got[("localpaged_kv_cache_usage_ratio", ())] == pytest.approx(10 / 64)
    assert got[("localpaged_prefix_cache_hits_total", ())] == 32
    assert got[("localpaged_num_preemptions_total", ())] == 2
    assert got[("localpaged_spec_decode_draft_tokens_total", ())] == 40
    assert got[("localpaged_spec_decode_accepted_tokens_total", ())] == 29
    assert got[("localpaged_num_requests_waiting", ())] == 1
    for reason in ("length", "stop", "abort"):
        assert got[("localpaged_requests_finished_total", (("finish_reason", reason),))] == 1
    assert got[("localpaged_prompt_tokens_total", ())] == 50
    assert got[("localpaged_generation_tokens_total", ())] == 16
    assert got[("localpaged_prefix_cached_prompt_tokens_total", ())] == 16

    ttfts = [m.first_token_time - m.arrival_time for m, _, _ in runs if m.first_token_time]
    assert got[("localpaged_time_to_first_token_seconds_count", ())] == len(ttfts)
    assert got[("localpaged_time_to_first_token_seconds_sum", ())] == pytest.approx(sum(ttfts))
    for bound in TTFT_BUCKETS:
        expected = sum(1 for t in ttfts if t <= bound)
        le = (("le", str(float(bound))),)
        assert got[("localpaged_time_to_first_token_seconds_bucket", le)] == expected, bound
    latencies = sorted(m.finished_time - m.arrival_time for m, _, _ in runs)
    assert got[("localpaged_request_latency_seconds_count", ())] == 3
    assert got[("localpaged_request_latency_seconds_bucket", (("le", "0.5"),))] \
        == bisect.bisect_right(latencies, 0.5)
    # decode tokens/s: (generated - 1) / (finished - first token), for requests with > 1 token
    assert got[("localpaged_decode_tokens_per_second_sum", ())] \
        == pytest.approx(10 / 0.98 + 4 / 2.0)
    assert got[("localpaged_decode_tokens_per_second_count", ())] == 2


def test_recorders_are_independent_and_stats_optional():
    a, b = MetricsRecorder(), MetricsRecorder()
    a.record_request(RequestMetrics(0.0, 0.1, 0.5, 0, 3), "stop", 4)
    got_a, got_b = samples(a.render(None)), samples(b.render(None))
    assert got_a[("localpaged_requests_finished_total", (("finish_reason", "stop"),))] == 1
    assert ("localpaged_requests_finished_total", (("finish_reason", "stop"),)) not in got_b
    assert got_b[("localpaged_generation_tokens_total", ())] == 0
    assert not any(name.startswith("localpaged_kv_") for name, _ in got_a)


def test_two_servers_serve_their_own_metrics(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=48, max_num_seqs=4)
    engine = AsyncEngine(llm.engine)
    servers = []
    try:
        urls = []
        for _ in range(2):
            app = build_app(engine, "tiny")
            server = make_server(app, "127.0.0.1", 0, log_level="warning")
            start_in_thread(server)
            servers.append(server)
            urls.append(f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}")
        r = httpx.post(urls[0] + "/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 6,
                             "temperature": 0})
        assert r.status_code == 200
        first, second = (httpx.get(u + "/metrics", timeout=30) for u in urls)
        assert first.headers["content-type"].startswith("text/plain; version=0.0.4")
        got, other = samples(first.text), samples(second.text)
        assert got[("localpaged_requests_finished_total", (("finish_reason", "length"),))] == 1
        assert got[("localpaged_generation_tokens_total", ())] == 6
        assert got[("localpaged_prompt_tokens_total", ())] == 3
        assert got[("localpaged_time_to_first_token_seconds_count", ())] == 1
        assert other[("localpaged_generation_tokens_total", ())] == 0
        for parsed in (got, other):       # engine gauges: the same engine behind both
            assert parsed[("localpaged_kv_blocks", (("state", "total"),))] == 48
    finally:
        for server in servers:
            server.should_exit = True
        engine.shutdown()
