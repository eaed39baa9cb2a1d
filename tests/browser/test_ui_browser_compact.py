"""Compact in a real browser: the app on the long-context tiny model, driven by Playwright
through headless Chromium. A few turns, a short compaction prompt typed into the conversation
settings, then 🗜 Compact with room for a long summary: the summary streams into the chat (its
text grows, at the top of the new branch, `‹ 2/2 ›`) and Stop leaves the conversation as it
was (the original path shown whole, one root in the store). Then Compact with a short summary:
the tab shows the new branch (the summary, marked, then the recent turns); a click on the
marker's left half shows the original path again, whole, and the store holds both.
Screenshots: artifacts/ui/compact.png (the summary streaming), artifacts/ui/compact-*.png.
"""

from __future__ import annotations

import json

import pytest

from test_ui_browser import (ARTIFACTS, browser_page, configure, open_app, running_app, saved,
                             send, text, wait_idle, wait_text)

pytestmark = pytest.mark.slow

WORDS = ["".join(chr(0x100 + 30 * i + j) for j in range(20)) for i in range(4)]   # disjoint
ASK = "ʃʄʅʆ"


@pytest.fixture(scope="module")
def app(tiny_root, tmp_path_factory):
    yield from running_app(tiny_root, tmp_path_factory)


@pytest.fixture(scope="module")
def page(app):
    yield from browser_page("compact-*.png")


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"compact-{name}.png"), timeout=60_000)


def test_compact_in_the_browser(app, page):
    open_app(page, app)
    try:
        compact_and_go_back(page, app)
    except Exception:
        shot(page, "failure")
        raise


def compact_and_go_back(page, app) -> None:
    page.locator("#settings0").get_by_text("Conversation settings").click()
    for key, value in (("max_tokens", "6"), ("temperature", "0")):
        box = page.locator(f"#s0-{key} input").first
        box.fill(value)
        box.press("Tab")
    prompt = page.locator("#compactprompt0 textarea")
    prompt.fill(ASK)
    prompt.press("Tab")                                      # saved on blur
    saved(app, "SELECT options FROM conversations",
          lambda rows: rows and json.loads(rows[0][0]).get("compact_prompt") == ASK)
    page.locator("#settings0").get_by_text("Conversation settings").click()
    for i, word in enumerate(WORDS[:3]):
        send(page, 0, word)
        page.wait_for_function("n => (document.querySelector('#chat0').innerText"
                               ".match(/\\d+ tokens · TTFT/g) || []).length >= n", arg=i + 1,
                               timeout=60_000)
        wait_idle(page, 0)
    shot(page, "01-before")
    stop_the_summary(page, app)
    configure(page, 0, app, max_tokens=6)

    page.click("#compact0")
    wait_text(page, "#chat0", "compacted; the original", timeout=60_000)
    wait_text(page, "#chat0", WORDS[2][:15], timeout=60_000)     # the copies follow the summary
    chat = text(page, "#chat0")
    assert "‹ 2/2 ›" in chat and WORDS[2][:15] in chat and WORDS[0][:15] not in chat
    rows = saved(app, "SELECT id, extra FROM messages WHERE parent_id IS NULL ORDER BY id",
                 lambda rows: len(rows) == 2)
    summary_of = json.loads(rows[1][1])["summary_of"]
    assert summary_of[0] == rows[0][0]                       # the original's first message
    marker = page.locator("#chat0 .lp-sib").first
    marker.scroll_into_view_if_needed()
    shot(page, "02-compacted")

    box = marker.bounding_box()
    page.mouse.click(box["x"] + 3, box["y"] + box["height"] / 2)
    wait_text(page, "#chat0", "‹ 1/2 ›")
    chat = text(page, "#chat0")
    assert all(w[:15] in chat for w in WORDS[:3]) and "Summary of" not in chat
    shot(page, "03-original")


def stop_the_summary(page, app) -> None:
    """Compact with room for a long summary: it streams (the chat's text grows), then Stop."""
    configure(page, 0, app, max_tokens=30000)
    page.click("#compact0")
    wait_text(page, "#chat0", "Writing a summary", timeout=60_000)
    chat = text(page, "#chat0")
    assert "‹ 2/2 ›" in chat and WORDS[0][:15] not in chat     # the new branch, summary only
    grown = "n => document.querySelector('#chat0').innerText.length > n + 20"
    page.wait_for_function(grown, arg=len(chat), timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "compact.png"), timeout=60_000)
    page.click("#stop0")
    wait_text(page, "#chat0", "Writing a summary", present=False)
    wait_idle(page, 0)
    chat = text(page, "#chat0")
    assert all(w[:15] in chat for w in WORDS[:3]) and "‹" not in chat
    saved(app, "SELECT COUNT(*) FROM messages WHERE parent_id IS NULL",
          lambda rows: rows[0][0] == 1)                           # nothing of it was kept
