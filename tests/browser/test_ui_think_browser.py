"""In a real browser (the app as `python app.py`, tiny model, headless Chromium; test_ui_browser's
`app` fixture, a fresh app for this module): Compare's "Think N ways" with four branches and a
prune margin of 0 shows its rule while the branches run, prunes all but the best at the first
checkpoint (each pruned column says where and what it gave back, as the stored replies do), and
ends with the vote line; the four replies are siblings in the store."""

from __future__ import annotations

import json

import pytest

from localpaged.core.sampling_params import PruneRule

from test_ui_browser import app, configure, open_app, page, saved, shot  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

REPLIES = ("SELECT parent_id, status, stats FROM messages WHERE role = 'assistant' ORDER BY id")


def test_think_four_ways(app, page):
    open_app(page, app)
    configure(page, 0, app, temperature=0.9, seed=7, max_tokens=64)
    page.click("#tab-compare-button")
    page.wait_for_selector("#cmp-prompt textarea", state="visible")
    page.locator("#cmp-k label", has_text="4").click()
    page.locator("#cmp-think input").check()
    margin = page.locator("#cmp-margin input")
    margin.fill("0")
    margin.press("Tab")
    page.fill("#cmp-prompt textarea", "ĀāĂăĄąĆć")
    page.click("#cmp-run")
    page.locator("#cmp-summary").get_by_text("Think 4 ways").wait_for(timeout=60_000)
    page.wait_for_function(
        "() => /Majority vote|No short final answers/.test("
        "document.querySelector('#cmp-summary').innerText)", timeout=120_000)
    summary = page.locator("#cmp-summary").inner_text()
    at = PruneRule().after
    assert summary.count(f"pruned at token {at}") == 3, summary
    rows = saved(app, REPLIES, lambda rows: len(rows) == 4
                 and all(r[1] in ("complete", "stopped") for r in rows))
    stats = [json.loads(r[2]) for r in rows]
    assert len({r[0] for r in rows}) == 1                       # siblings of one prompt
    pruned = [j for j, s in enumerate(stats) if "pruned" in s]
    assert len(pruned) == 3
    for j in pruned:
        column = page.locator(f"#cmp-stats{j}").inner_text()
        assert f"pruned at token {at}" in column
        assert f"gave back {stats[j]['released_blocks']} KV blocks" in column
        assert f"Branch {j + 1} pruned" in summary
    shot(page, "think-n-ways")
    assert page.errors == []
