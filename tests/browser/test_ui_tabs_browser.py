"""In Chromium: the loading page at start-up turning into the chat page by itself, Regenerate on
an empty chat saying why, a fifth, a tenth and a thirteenth tab (past the page's twelve, under
More tabs, and shown again from there), and a reload
that comes back to the tab and the scroll position the user was on. One app for the module,
started by the first test while the browser watches (screenshots: artifacts/ui/tabs-*.png).
"""

from __future__ import annotations

import threading
import time

import pytest
from test_ui_browser import (App, browser_page, choose, long_context_model, require_part, shot,
                             wait_idle)

from localpaged.ui.chat.events import NOTHING_TO_REGENERATE
from localpaged.ui.tabs.view import N_SLOTS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def page():
    for pg in browser_page("tabs-*.png"):
        pg.set_default_timeout(90_000)            # a 12-tab page on a loaded 2-core machine
        yield pg


@pytest.fixture(scope="module")
def app(tiny_root, tmp_path_factory, page):
    """Not started yet: the first test starts it, to watch the loading page."""
    import os

    from test_ui_browser import CHROMIUM
    require_part(f"Chromium ({CHROMIUM})", os.path.exists(CHROMIUM),
                 "`apt-get install -y chromium`, done by scripts/setup.sh")
    tmp = tmp_path_factory.mktemp("ui-tabs")
    a = App(long_context_model(tiny_root), tmp / "data", tmp / "app.log")
    yield a
    a.stop()


def visible_tabs(page) -> int:
    return page.evaluate("() => [...document.querySelectorAll('[id^=tab][id$=-button]')]"
                         ".filter((b) => /^tab\\d+-button$/.test(b.id) && b.offsetParent)"
                         ".length")


def settled(page, scroller: str) -> None:
    """Wait until the chat's height held for a second: Gradio's Chatbot scrolls itself to the end
    300 ms after a value lands while it is at its end (the stopped reply's last update lands
    after the stop), which would undo a scroll made meanwhile."""
    page.wait_for_function(f"""() => {{ const w = document.querySelector('{scroller}');
        const h = w.scrollHeight, now = Date.now(), s = window.__lpHeld || {{}};
        if (s.h !== h) {{ window.__lpHeld = {{h, since: now}}; return false; }}
        return now - s.since > 1000; }}""", polling=100)


def test_the_loading_page_turns_into_the_chat_page(app, page):
    starter = threading.Thread(target=app.start, kwargs={"timeout": 300}, daemon=True)
    starter.start()                          # returns once "/" is the chat page (200)
    deadline = time.monotonic() + 120
    while True:                              # the port answers within seconds: the loading page
        try:
            page.goto(app.url)
            break
        except Exception:  # noqa: BLE001 - connection refused until uvicorn listens
            assert time.monotonic() < deadline, "the port never answered"
            time.sleep(0.2)
    page.locator("#lp-loading").wait_for()
    page.wait_for_function("() => document.querySelectorAll('#steps li').length > 0")
    assert page.locator("#phase").inner_text().strip()
    shot(page, "tabs-01-loading")
    page.locator("#msg0").wait_for(timeout=300_000)    # reloaded by itself into the chat page
    starter.join(60)
    print("DOM elements of the chat page:", page.evaluate("document.querySelectorAll('*').length"))
    shot(page, "tabs-02-ready")
    assert page.locator("#lp-loading").count() == 0


def test_regenerate_on_an_empty_chat_says_why(page):
    page.click("#regen0")
    page.get_by_text(NOTHING_TO_REGENERATE[:40]).first.wait_for()
    shot(page, "tabs-03-regenerate-empty")


def test_a_fifth_a_tenth_and_a_thirteenth_tab_open(page):
    assert visible_tabs(page) == 1, page.errors
    for n in range(2, N_SLOTS + 1):
        page.click("#new-chat")
        page.locator(f"#tab{n - 1}-button").wait_for(state="visible")
        assert visible_tabs(page) == n                 # a new tab each time, none replaced
        if n == 10:
            assert page.locator("#tab4-button").is_visible()
            shot(page, "tabs-04-ten-tabs")
    page.click("#new-chat")                            # the 13th: tab 1 moves to More tabs
    page.get_by_text("moved to More tabs").first.wait_for()
    more = page.locator("#lp-more")
    more.get_by_text("More tabs (1)").wait_for()
    assert visible_tabs(page) == N_SLOTS
    page.wait_for_function("() => document.querySelector('#tab0-button')"
                           ".getAttribute('aria-selected') === 'true'")
    shot(page, "tabs-05-more")
    choose(page, "#lp-more", "New chat",               # shown again, tab 2 moves there
           "() => document.querySelector('#tab1-button').getAttribute('aria-selected') === 'true'")
    more.get_by_text("More tabs (1)").wait_for()
    assert visible_tabs(page) == N_SLOTS


def test_a_reload_comes_back_to_the_tab_and_its_scroll(page):
    page.click("#tab2-button")
    page.fill("#msg2 textarea", "\n".join(f"line {k} of a long message" for k in range(80)))
    page.click("#send2")
    page.wait_for_function("() => document.querySelector('#chat2').innerText.includes('line 79')")
    page.click("#stop2")
    wait_idle(page, 2)
    scroller = "#chat2 .bubble-wrap"
    room = page.evaluate(f"() => {{ const w = document.querySelector('{scroller}'); "
                         "return w.scrollHeight - w.clientHeight; }")
    assert room > 600, room                             # long enough to be somewhere in between
    settled(page, scroller)
    for _ in range(3):                                  # as a user would scroll up again
        page.evaluate(f"() => {{ document.querySelector('{scroller}').scrollTop = 300; }}")
        page.wait_for_timeout(800)                      # the debounced save
        if page.evaluate(f"() => document.querySelector('{scroller}').scrollTop") == 300:
            break
    saved = page.evaluate("() => JSON.parse(localStorage.getItem('localpaged.scroll'))")
    assert saved["chats"]["chat2"]["top"] == 300, saved
    page.reload()
    page.locator("#msg2").wait_for()
    page.wait_for_function("() => document.querySelector('#tab2-button')"
                           ".getAttribute('aria-selected') === 'true'")
    page.wait_for_function(f"() => {{ const w = document.querySelector('{scroller}'); "
                           "return w && Math.abs(w.scrollTop - 300) < 30; }", timeout=20_000)
    page.wait_for_timeout(2500)                         # it stays there once the chat settled
    top = page.evaluate(f"() => document.querySelector('{scroller}').scrollTop")
    assert abs(top - 300) < 30, top
    shot(page, "tabs-06-reloaded")
    assert not page.errors, page.errors
