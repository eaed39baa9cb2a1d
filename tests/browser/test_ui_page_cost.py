"""The page's cost in Chromium, from the browser's own counters (browser_cost.py): after an
hour-like session of forty messages in four tabs (long replies with code and LaTeX) and a short
reply in each, the idle page costs at most 2% of a core, four tabs streaming at once at most
50%, and Stop, clicked while they stream, reaches the server within 200 ms (the median of
browser_cost.STOP_ROUNDS rounds, each round's time printed beside it). The figures measured
on this project's machines (bench/page_cost.py) are in docs/benchmarks.md."""

from __future__ import annotations

import os

import pytest
from browser_cost import measure_session
from test_ui_browser import CHROMIUM, require_part

pytestmark = pytest.mark.slow


def test_the_page_is_light_idle_and_streaming_and_stop_arrives_fast(tmp_path):
    require_part(f"Chromium ({CHROMIUM})", os.path.exists(CHROMIUM),
                 "`apt-get install -y chromium`, done by scripts/setup.sh")
    got = measure_session(tmp_path, start_timeout=600)
    print("page cost:", got)
    assert got["idle_core_share"] <= 0.02, got
    assert got["streaming_4_tabs_core_share"] <= 0.50, got
    assert got["stop_to_server_s"] <= 0.200, got
