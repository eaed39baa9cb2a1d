"""The context features in a real browser: the app started as
`python app.py --max-model-len 200` with the tiny model, driven by Playwright through Debian's
headless Chromium. Steps (screenshots artifacts/ui/ctx-*.png): the cursor starts in the message
box, which is also the first field Tab reaches; the gauge follows --max-model-len and moves as
you type; a conversation grown past the context shows the "not in the model's context" marker
and still gets replies; Continue extends a reply that stopped at its token limit in place.
"""

from __future__ import annotations

import re

import pytest

from test_ui_browser import (ARTIFACTS, browser_page, running_app, send, text, wait_idle,
                             wait_text)

pytestmark = pytest.mark.slow

LIMIT = 200
WORDS = ["".join(chr(0x100 + 50 * i + j) for j in range(50)) for i in range(8)]   # disjoint


@pytest.fixture(scope="module")
def app(tiny_root, tmp_path_factory):
    yield from running_app(tiny_root, tmp_path_factory, "--max-model-len", str(LIMIT))


@pytest.fixture(scope="module")
def page(app):
    yield from browser_page("ctx-*.png")


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"ctx-{name}.png"))


def gauge(page) -> dict:
    """The gauge's numbers (its data attributes) and text."""
    return page.evaluate("""() => { const g = document.querySelector('#gauge0 .lp-gauge');
        return g ? {tokens: +g.dataset.tokens, limit: +g.dataset.limit,
                    cls: g.className, text: g.innerText} : null; }""")


def wait_gauge(page, test: str, arg=None, timeout: float = 30_000) -> dict:
    page.wait_for_function(
        "([t, a]) => { const g = document.querySelector('#gauge0 .lp-gauge');"
        " return !!g && g.dataset.tokens !== undefined && (" + test + "); }",
        arg=[test, arg], timeout=timeout)
    return gauge(page)


def focused_box(page) -> str | None:
    return page.evaluate("() => document.activeElement?.closest(\"[id^='msg']\")?.id ?? null")


def first_in_tab_order(page) -> str | None:
    """The first field of the page's sequential focus order (HTML: positive tabindex first, by
    value, then tabindex 0 in document order), among visible, enabled elements."""
    return page.evaluate("""() => {
        const sel = 'a[href], button, input, textarea, select, [tabindex]';
        const els = [...document.querySelectorAll(sel)].filter((e) => e.tabIndex >= 0
            && !e.disabled && e.offsetParent !== null);
        const key = (e) => e.tabIndex > 0 ? e.tabIndex : Infinity;
        const first = els.map((e, i) => [key(e), i, e]).sort((a, b) => a[0] - b[0] || a[1] - b[1])[0];
        return first ? (first[2].closest("[id^='msg']")?.id ?? first[2].outerHTML.slice(0, 80)) : null;
    }""")


def test_context_features_in_the_browser(app, page):
    try:
        walk_through(page, app)
    except Exception:
        shot(page, "failure")
        raise


def walk_through(page, app) -> None:
    page.goto(app.url)
    page.wait_for_selector("#msg0 textarea", state="visible", timeout=60_000)
    # The first screen: the cursor in the message box; Tab from the top reaches it first.
    page.wait_for_function("() => document.activeElement?.closest(\"[id^='msg']\")?.id === 'msg0'")
    assert first_in_tab_order(page) == "msg0"
    shot(page, "01-open-focused")

    # The gauge follows --max-model-len and moves as you type.
    g0 = wait_gauge(page, "+g.dataset.limit > 0")
    assert g0["limit"] == LIMIT and "lp-gauge-ok" in g0["cls"]
    page.locator("#msg0 textarea").press_sequentially(WORDS[0][:30], delay=10)
    g1 = wait_gauge(page, "+g.dataset.tokens >= a", g0["tokens"] + 30)
    assert g1["tokens"] >= g0["tokens"] + 30 and f"/ {LIMIT} tokens" in g1["text"]
    shot(page, "02-gauge-typing")

    # Short replies (max tokens 6), then grow the chat past the context: it keeps replying.
    page.locator("#settings0").get_by_text("Conversation settings").click()
    box = page.locator("#s0-max_tokens input").first
    box.fill("6")
    box.press("Tab")
    box = page.locator("#s0-temperature input").first        # greedy: no early end
    box.fill("0")
    box.press("Tab")
    page.locator("#settings0").get_by_text("Conversation settings").click()
    for i, word in enumerate(WORDS[:5]):
        send(page, 0, word)
        page.wait_for_function("n => (document.querySelector('#chat0').innerText"
                               ".match(/\\d+ tokens · TTFT/g) || []).length >= n", arg=i + 1,
                               timeout=60_000)                  # its reply's footer is there
        wait_idle(page, 0)
    chat = text(page, "#chat0")
    m = re.search(r"(\d+) earlier messages are not in the model's context", chat)
    assert m and int(m.group(1)) >= 2 and int(m.group(1)) % 2 == 0
    assert all(w[:20] in chat for w in WORDS[:5])              # nothing lost from the view
    assert chat.count("■ stopped: the reply reached its token limit") == 5
    shot(page, "03-marker-and-replies")

    # Continue extends the last reply (stopped at 6 tokens) in place: 12 tokens, prefill skipped.
    page.click("#cont0")
    page.wait_for_function("() => document.querySelector('#chat0').innerText"
                           ".includes('12 tokens')", timeout=60_000)
    wait_idle(page, 0)
    chat = text(page, "#chat0")
    last = chat[chat.rindex(WORDS[4][:20]):]
    assert "12 tokens" in last and "prefill skipped" in last
    assert chat.count("■ stopped") == 5                       # the same reply, no new one
    shot(page, "04-continued")
