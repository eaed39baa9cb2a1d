"""The KV disk tier in the browser: a conversation, the app killed and started again on the same
data directory, the restored tab, one more message: its footer says the prefill it skipped came
from disk, and the engine panel shows the tier. Then the clear button empties it. (Token
identity with an app that never restarted: tests/ui/test_ui_kv_disk.py, at the controller level.)"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from test_ui_browser import ARTIFACTS, browser_page, open_app, running_app, send, text, wait_idle, wait_text

# The tiny tokenizer knows U+0100..U+02FC, one token a character.
LONG = "".join(chr(0x100 + (i * 7) % 0x1F0) for i in range(2000))   # a 2,000-token chat
MORE = "ȀȁȂȃȄȅȆȇȈȉȊȋ"


@pytest.fixture(scope="module")
def app(tiny_root, tmp_path_factory):
    yield from running_app(tiny_root, tmp_path_factory, "--kv-disk-gb", "1")


def open_ready(page, app, tries: int = 3) -> None:
    """open_app, again while the app still shows its loading page (start-up serves the port
    before the chat page is built)."""
    for attempt in range(tries):
        try:
            return open_app(page, app)
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise


@pytest.fixture(scope="module")
def page(app):
    yield from browser_page("kv-disk-*.png")


def test_the_first_reply_after_a_restart_reads_back_from_disk(app, page):
    open_ready(page, app)
    send(page, 0, LONG)
    wait_text(page, "#chat0", LONG[:40])             # sent (a long message takes a moment)
    # idle only counts once the reply has begun (its footer has a TTFT): right after the click
    # the tab may not show its stream yet
    wait_text(page, "#chat0", "TTFT", timeout=60_000)
    wait_idle(page, 0)
    wait_text(page, "#engine-panel", "Disk tier:")
    app.stop()                                       # the app is killed (SIGTERM)
    app.start()
    open_ready(page, app)
    wait_text(page, "#chat0", LONG[:40])              # the tab came back
    send(page, 0, MORE)
    # the footer says "from disk" from the reply's first token on, so idle is checked after it: a
    # Clear while the reply still streams leaves its blocks, saved when it ends (CI, stop 32)
    wait_text(page, "#chat0", "from disk", timeout=60_000)
    wait_idle(page, 0)
    footer = re.search(r"prefill skipped: (\d+) tokens \((\d+) from disk\)", text(page, "#chat0"))
    assert footer and int(footer.group(2)) > 0 and int(footer.group(2)) <= int(footer.group(1))
    wait_text(page, "#engine-panel", "read back")
    page.screenshot(path=str(ARTIFACTS / "kv-disk-after-restart.png"))
    page.click("#kv-disk-clear")
    wait_text(page, "body", "Clearing the KV disk tier")
    try:
        wait_text(page, "#engine-panel", "Disk tier: 0 blocks", timeout=60_000)
    except PlaywrightTimeout:       # say what the panel and the app showed instead
        pytest.fail(f"the tier was not emptied; the panel: {text(page, '#engine-panel')!r}\n"
                    f"the app's log: {app.log.read_text()[-3000:]}")
    assert not page.errors
