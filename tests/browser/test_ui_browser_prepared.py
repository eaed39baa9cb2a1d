"""In a real browser (the app as `python app.py`, tiny model, headless Chromium; test_ui_browser's
`app` fixture, a fresh app for this module): a reply prepared in the background is shown by
Regenerate at once and its footer says it was prepared; the Edit box previews what the new
branch reuses and prefills, and the saved branch reports that same reuse; Compare in beam-search mode shows each beam's score.
What the app saved is polled in its SQLite file (read-only), never waited for with a sleep.
Screenshots in artifacts/ui-prepared/.
"""

from __future__ import annotations

import json
import re

import pytest

from test_ui_browser import (BROWSER_ARGS, CHROMIUM, REPO, app, configure, open_app,  # noqa: F401 (app)
                             saved, send, text, wait_idle, wait_text)

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "artifacts" / "ui-prepared"
FIRST = "A long first question about paged attention and block tables, version one"


@pytest.fixture(scope="module")
def page(app):
    from playwright.sync_api import sync_playwright
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        pg = browser.new_page(viewport={"width": 1440, "height": 960})
        pg.set_default_timeout(30_000)
        yield pg
        browser.close()


def test_prepared_regenerate_edit_preview_and_beams(app, page):
    try:
        walk(app, page)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "failure.png"))
        raise


def walk(app, page) -> None:
    open_app(page, app)
    # Greedy, short replies, one alternative prepared after each reply.
    configure(page, 0, app, temperature=0, max_tokens=24)
    page.locator("#settings0").get_by_text("Conversation settings").click()
    page.locator("#prep0").get_by_text("1", exact=True).click()
    saved(app, "SELECT options FROM conversations",
          lambda rows: rows and json.loads(rows[0][0]).get("alternatives") == 1)
    page.locator("#settings0").get_by_text("Conversation settings").click()

    send(page, 0, FIRST)
    wait_idle(page, 0)
    saved(app, "SELECT id FROM messages WHERE prepared = 'unseen' AND status = 'complete'",
          lambda rows: len(rows) == 1)
    page.click("#regen0")                       # reveals it: no new reply streams
    wait_text(page, "#chat0", "prepared in the background")
    wait_text(page, "#sel0", "branch 2/2")
    assert "▌" not in text(page, "#chat0")
    page.screenshot(path=str(ARTIFACTS / "01-prepared-revealed.png"))

    # Edit the first message: the preview, then the saved branch reuses exactly that.
    page.locator("#chat0 [data-testid=user]").first.click()
    wait_text(page, "#sel0", "Your message 1 of 2")
    page.click("#edit0")
    page.wait_for_selector("#editbox0 textarea", state="visible")
    page.fill("#editbox0 textarea", FIRST.replace("version one", "version two"))
    # An edit at the end of a long message reuses its start: wait for that preview.
    page.wait_for_function("() => /Reuses [1-9][\\d,]* tokens from the cache, prefills [1-9]/"
                           ".test(document.querySelector('#editcost0').innerText)")
    preview = text(page, "#editcost0")
    reused, prefill = (int(n.replace(",", "")) for n in re.search(
        r"Reuses ([\d,]+) tokens from the cache, prefills ([\d,]+)", preview).groups())
    page.screenshot(path=str(ARTIFACTS / "02-edit-preview.png"))
    page.click("#editsave0")
    wait_text(page, "#chat0", "version two")
    wait_idle(page, 0)
    footer = text(page, "#chat0")
    assert f"prefill skipped: {reused} tokens" in footer, (preview, footer)

    # Compare, beam search of width 2 over the one prompt: each column shows its score.
    page.click("#tab-compare-button")
    page.wait_for_selector("#cmp-prompt textarea", state="visible")
    page.locator("#cmp-k").get_by_text("2", exact=True).click()
    page.locator("#cmp-beam input").check()
    page.fill("#cmp-prompt textarea", "Two beams, please")
    page.click("#cmp-run")
    for j in (0, 1):
        wait_text(page, f"#cmp-stats{j}", "score", timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "03-compare-beams.png"))
