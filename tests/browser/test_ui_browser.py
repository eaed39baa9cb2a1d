"""End to end in a real browser: the chat app started as `python app.py` (tiny random model,
temp data dir, free port) and driven by Playwright through Debian's headless Chromium.

Steps (a screenshot each in artifacts/ui/): open; send and watch it stream (chat text with HTML
and a script shows as text); stop; regenerate (the engine panel shows the branches sharing
blocks); switch siblings; edit an earlier message into a branch; a 3-column comparison and
continuing with one column; a second tab generating together with the first; fork, search and
delete (confirmed); a model that cannot be loaded; reload the page; restart the app. The tiny
model's replies are noise: the test checks structure, not words.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.parts import require_part
from helpers.tiny_chat import poll

from localpaged.ui.store import DB_FILENAME
from localpaged.ui.tabs.logic import OpenTabsFile

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("LOCALPAGED_CHROMIUM", "/usr/bin/chromium")   # as scripts/setup.sh
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "ui"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]
EVIL = 'Hi <img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> there, friend'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class App:
    """The app as a user runs it: `python app.py ...` in a subprocess."""

    def __init__(self, model: str, data_dir: Path, log: Path) -> None:
        self.port, self.log, self.data_dir = _free_port(), log, data_dir
        self.cmd = [sys.executable, str(REPO / "app.py"), "--model", model, "--data-dir",
                    str(data_dir), "--port", str(self.port), "--num-kv-blocks", "2560"]
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 150) -> None:
        # One torch thread: the browser needs the other core to keep up.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "OMP_NUM_THREADS": "1"}
        out = self.log.open("a")
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=env, stdout=out,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the app exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(self.url, timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"the app did not come up:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def long_context_model(root: str) -> str:
    """The tiny Llama with a 32768-token context, so a reply streams far longer than the Stop
    click takes to land, however fast the engine (the stock one runs out of context in ~3 s)."""
    from helpers import tiny_models
    from transformers import LlamaConfig
    tiny_models.CONFIGS.setdefault("llama-long", lambda: LlamaConfig(
        num_attention_heads=4, num_key_value_heads=2,
        **{**tiny_models.COMMON, "max_position_embeddings": 32768}))
    return tiny_models.build("llama-long", root)


def running_app(tiny_root, tmp_path_factory, *args: str, model: str | None = None):
    """Yields the app on the long-context tiny model (or the model at `model`), with extra CLI
    `args` (a fixture's body). A missing Chromium or playwright skips, or fails under
    LOCALPAGED_REQUIRE_ALL (conftest)."""
    require_part(f"Chromium ({CHROMIUM})", os.path.exists(CHROMIUM),
                 "`apt-get install -y chromium`, done by scripts/setup.sh")
    require_part("the Python package playwright",
                 importlib.util.find_spec("playwright") is not None, "`pip install -e .[test]`")
    tmp = tmp_path_factory.mktemp("ui-app")
    a = App(model or long_context_model(tiny_root), tmp / "data", tmp / "app.log")
    a.cmd += list(args)
    a.start()
    yield a
    a.stop()


@pytest.fixture(scope="module")
def app(tiny_root, tmp_path_factory):
    yield from running_app(tiny_root, tmp_path_factory)


@pytest.fixture(scope="module")
def page(app):
    yield from browser_page("*.png")


def browser_page(old_shots: str):
    """Yields a Chromium page; screenshots matching `old_shots` in ARTIFACTS are removed first."""
    from playwright.sync_api import sync_playwright
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob(old_shots):
        old.unlink()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        pg = browser.new_page(viewport={"width": 1440, "height": 960})
        pg.set_default_timeout(30_000)
        pg.errors = []
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        yield pg
        browser.close()


# ---- helpers -------------------------------------------------------------------------------
def shot(page, name: str) -> None:
    # A screenshot waits for the page's fonts, which a page busy with streams on a 2-core
    # machine may take past the default 30 s to report (CI, stop 21): a minute.
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), timeout=60_000)


def text(page, selector: str) -> str:
    return page.locator(selector).inner_text()


def wait_text(page, selector: str, needle: str, present: bool = True, timeout: float = 30_000):
    page.wait_for_function(
        "([s, n, p]) => { const e = document.querySelector(s); "
        "return !!e && e.innerText.includes(n) === p; }", arg=[selector, needle, present],
        timeout=timeout)


def wait_idle(page, i: int) -> None:
    """Tab i has no streaming reply (no cursor, its tab label has no ● mark)."""
    wait_text(page, f"#chat{i}", "▌", present=False, timeout=60_000)
    wait_text(page, f"#tab{i}-button", "●", present=False, timeout=60_000)


def configure(page, i: int, app, **values) -> None:
    """Set tab i's conversation settings, one field at a time, each until the store holds it.

    A settings box saves on its own input event. Now and then (about one run in five on a busy
    2-core machine) Gradio's slider box sends its previous value after Playwright's fill, and
    shows that value again: so a field whose value the store does not show within a few
    seconds is filled again, as a user would retype what the box set back."""
    page.locator(f"#settings{i}").get_by_text("Conversation settings").click()
    for name, value in values.items():
        box = page.locator(f"#s{i}-{name} input").first
        box.wait_for(state="visible")
        for attempt in range(3):
            box.fill(str(value))
            box.press("Tab")
            try:
                saved(app, "SELECT sampling FROM conversations", lambda rows: any(
                    json.loads(r[0]).get(name) == value for r in rows), timeout=5.0)
                break
            except AssertionError:
                if attempt == 2:
                    raise
    page.locator(f"#settings{i}").get_by_text("Conversation settings").click()
    page.evaluate("window.scrollTo(0, 0)")


def saved(app, sql: str, check, timeout: float = 30.0):
    """Poll the app's store (read-only) until check(rows) holds; returns the rows."""
    db = app.data_dir / DB_FILENAME
    deadline = time.monotonic() + timeout
    while True:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = conn.execute(sql).fetchall()
        finally:
            conn.close()
        if check(rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"the app never saved what `{sql}` looks for: {rows}")
        time.sleep(0.05)                  # a polling interval, under a deadline


def choose(page, dropdown: str, option: str, chosen_js: str, arg=None) -> None:
    """Pick `option` in the Gradio dropdown `dropdown` (a selector) by typing it (its list
    animates), until `chosen_js` (a function of `arg`) holds. Now and then, in a long run of the
    suite, the dropdown closes before the Enter lands and nothing is chosen: the pick is made
    again, as a user would, at most three times."""
    box = page.locator(f"{dropdown} input")
    for attempt in range(3):
        box.click()
        page.get_by_role("option", name=option).first.wait_for(state="visible")
        box.fill(option)
        box.press("Enter")
        try:
            page.wait_for_function(chosen_js, arg=arg, timeout=15_000)
            return
        except Exception:     # playwright's TimeoutError
            if attempt == 2:
                raise


def send(page, i: int, message: str) -> None:
    page.fill(f"#msg{i} textarea", message)
    page.click(f"#send{i}")


SHOWN_TAB_JS = ("() => { const t = [...document.querySelectorAll(\"[id^='msg'] textarea\")]"
                ".find((t) => t.offsetParent !== null); "
                "return t ? Number(t.closest(\"[id^='msg']\").id.slice(3)) : null; }")


def shown_tab(page) -> int | None:
    """The chat tab the page shows (its message box is visible), None while none is."""
    return page.evaluate(SHOWN_TAB_JS)


def open_app(page, app) -> None:
    # An old page of the app reloads itself when it sees the server come back after a restart;
    # navigating away first keeps that reload from racing ours (it once held our navigation
    # past its 30 s timeout, or interrupted it).
    if page.url.startswith(app.url):
        page.goto("about:blank")
    for attempt in range(3):
        try:
            page.goto(app.url, wait_until="commit")   # the page's own state is waited on
            break                                      # below (a load event once took 30 s+)
        except Exception as e:     # playwright's Error: a reload still under way
            if "interrupted by another navigation" not in str(e) or attempt == 2:
                raise
    page.wait_for_function(f"({SHOWN_TAB_JS})() !== null", timeout=60_000)
    wait_text(page, "#engine-panel", "In use")


# Sets window.__lpBothMarked once both tab labels show the streaming mark (●) at the same
# moment, watched on every change of either label: the tiny model (with drafts from the prompt)
# writes ~1,300 tokens a second, so replies of 1,200 tokens were at times both over before a
# poll looked, or one over before the other's follower began (hence 4,000 tokens each here).
BOTH_MARKED_JS = """() => { window.__lpBothMarked = false;
  const tabs = ['#tab0-button', '#tab1-button'].map((s) => document.querySelector(s));
  const look = () => { if (tabs.every((b) => b.innerText.startsWith('●'))) window.__lpBothMarked = true; };
  tabs.forEach((b) => new MutationObserver(look).observe(b, {subtree: true, childList: true,
                                                             characterData: true})); }"""


# ---- the walk-through --------------------------------------------------------------------
def test_chat_app_end_to_end(app, page):
    try:
        walk_through(app, page)
    except Exception:
        shot(page, "failure")             # what the page showed when a step failed
        raise


# Counts the animation frames the page is granted (installed before the page's own scripts, so
# it sits behind ui/page_head.py's early script, which refuses Gradio's status trackers' frames).
COUNT_FRAMES_JS = """(() => { const frame = window.requestAnimationFrame.bind(window);
  window.__lpFrames = 0;
  window.requestAnimationFrame = (cb) => { window.__lpFrames++; return frame(cb); }; })()"""


def renderer_cpu_s(page) -> float:
    """CPU seconds the browser's renderer processes have used so far (DevTools)."""
    cdp = page.context.browser.new_browser_cdp_session()
    try:
        procs = cdp.send("SystemInfo.getProcessInfo")["processInfo"]
    finally:
        cdp.detach()
    return sum(p["cpuTime"] for p in procs if p["type"] == "renderer")


def idle_cost(page, seconds: float = 5.0, tries: int = 3) -> tuple[int, float]:
    """(animation frames asked for, renderer CPU as a share of one core) over the quietest of
    `tries` stretches of `seconds` (the first may still hold the first screen's last work)."""
    best = None
    for _ in range(tries):
        frames, cpu, t0 = page.evaluate("window.__lpFrames"), renderer_cpu_s(page), \
            time.monotonic()
        page.wait_for_timeout(seconds * 1000)
        got = (page.evaluate("window.__lpFrames") - frames,
               (renderer_cpu_s(page) - cpu) / (time.monotonic() - t0))
        best = got if best is None or got[1] < best[1] else best
    return best


def walk_through(app, page) -> None:
    t0 = time.monotonic()
    page.add_init_script(COUNT_FRAMES_JS)
    open_app(page, app)
    shot(page, "01-open")

    # The idle page costs nothing: no animation frame (Gradio's loader leaves a status timer
    # asking for 60 a second: page_head.py stops it) and at most 2% of a core.
    frames, share = idle_cost(page)
    print(f"idle page: {frames} frames, {100 * share:.1f}% of a core")
    assert frames == 0 and share <= 0.02, (frames, share)

    # Send, watch it stream, stop it. The HTML and script in the message stay text.
    configure(page, 0, app, temperature=0, max_tokens=30000)    # greedy: the same run every time
    send(page, 0, EVIL)
    wait_text(page, "#chat0", "▌")
    first = len(text(page, "#chat0"))
    page.wait_for_function("n => document.querySelector('#chat0').innerText.length > n + 20",
                           arg=first)
    shot(page, "02-streaming")
    # The chat keeps its end in view as the reply grows (tabs/events.py FOLLOW_JS; the Chatbot's
    # own autoscroll is off): without it the chat would stay at its top.
    log = "document.querySelector('#chat0 [role=log]')"
    page.wait_for_function(f"() => {{ const l = {log}; return l && l.scrollHeight > "
                           "l.clientHeight + 200; }", timeout=60_000)
    page.wait_for_function(f"() => {{ const l = {log}; return l.scrollHeight - l.scrollTop - "
                           "l.clientHeight < 100; }", timeout=5_000)
    t_stop = time.monotonic()
    page.click("#stop0")
    wait_text(page, "#chat0", "stopped")
    print(f"stop took {time.monotonic() - t_stop:.2f} s")
    wait_idle(page, 0)
    assert '<script>window.__pwned=2</script>' in text(page, "#chat0")
    assert page.evaluate("window.__pwned") is None
    shot(page, "03-stopped")

    # Regenerate: a sibling; the engine panel shows the two branches sharing prompt blocks.
    configure(page, 0, app, max_tokens=48)
    page.click("#regen0")
    wait_text(page, "#sel0", "branch 2/2")
    wait_idle(page, 0)
    assert "‹ 2/2 ›" in text(page, "#chat0") and "prefill skipped" in text(page, "#chat0")
    page.wait_for_function("() => [...document.querySelectorAll('#engine-panel .lp-row')]"
                           ".filter(r => +r.dataset.shared > 0).length >= 2", timeout=15_000)
    shot(page, "04-regenerated")

    # Switch siblings: back to the stopped first reply.
    page.click("#prev0")
    wait_text(page, "#sel0", "branch 1/2")
    wait_text(page, "#chat0", "stopped")
    shot(page, "05-switched-sibling")

    # Edit the first message (after a second turn): a new branch, the old one kept.
    page.click("#next0")                  # back to the short reply (the tiny model's text
    wait_text(page, "#sel0", "branch 2/2")  # re-tokenizes into ~6 tokens per token)
    send(page, 0, "A second question")
    wait_text(page, "#chat0", "A second question")
    wait_idle(page, 0)
    page.locator("#chat0 [data-testid=user]").first.click()
    wait_text(page, "#sel0", "Your message 1 of 4")
    page.click("#edit0")
    page.wait_for_selector("#editbox0 textarea", state="visible")
    assert "window.__pwned=2" in page.input_value("#editbox0 textarea")
    page.fill("#editbox0 textarea", "An edited first question")
    page.click("#editsave0")
    wait_text(page, "#chat0", "An edited first question")
    wait_idle(page, 0)
    assert "A second question" not in text(page, "#chat0")      # the new branch is shown
    shot(page, "06-edited-branch")
    page.locator("#chat0 [data-testid=user]").first.click()
    wait_text(page, "#sel0", "branch 2/2")
    page.click("#prev0")
    wait_text(page, "#chat0", "A second question")              # the old branch is kept
    page.click("#next0")
    wait_text(page, "#chat0", "An edited first question")

    # Compare: one prompt, three columns (samples, seeds 7, 8, 9), continue with the second.
    configure(page, 0, app, temperature=0.9, seed=7)       # Compare reads them from the store
    page.click("#tab-compare-button")
    page.wait_for_selector("#cmp-prompt textarea", state="visible")
    page.fill("#cmp-prompt textarea", "Three ways to say hello")
    page.click("#cmp-run")
    page.wait_for_function("() => [0, 1, 2].every(j => !document.querySelector('#cmp-pick' + j)"
                           ".disabled) && document.querySelector('#cmp-out2').innerText.length > 5",
                           timeout=60_000)
    assert not page.locator("#cmp-out3").is_visible()
    shot(page, "07-compare")
    page.click("#cmp-pick1")
    wait_text(page, "#sel0", "branch 2/3")
    assert "Three ways to say hello" in text(page, "#chat0")
    shot(page, "08-compare-picked")

    # A second tab; both generate at once (both sends go out in the same instant).
    configure(page, 0, app, temperature=0, max_tokens=4000)
    page.click("#new-chat")
    page.wait_for_selector("#msg1 textarea", state="visible")
    configure(page, 1, app, temperature=0, max_tokens=4000)
    page.fill("#msg1 textarea", "Tab two is talking")
    page.click("#tab0-button")
    page.wait_for_selector("#msg0 textarea", state="visible")
    page.fill("#msg0 textarea", "Tab one is talking")
    page.evaluate(BOTH_MARKED_JS)      # the tiny model's replies can end within a second
    page.evaluate("() => { document.querySelector('#send1').click(); "
                  "document.querySelector('#send0').click(); }")
    page.wait_for_function("() => window.__lpBothMarked")
    shot(page, "09-two-tabs-streaming")
    wait_idle(page, 0)
    wait_idle(page, 1)
    assert page.locator("#tab1-button").inner_text() == "Tab two is talking"

    # Fork at the first message into a new conversation; search; delete it (confirmed).
    page.locator("#chat0 [data-testid=user]").first.click()
    wait_text(page, "#sel0", "Your message 1 of")
    page.click("#fork0")
    page.wait_for_selector("#msg2 textarea", state="visible")
    wait_text(page, "#tab2-button", "⎇")
    assert "An edited first question" in text(page, "#chat2")
    assert "Three ways" not in text(page, "#chat2")
    wait_text(page, "#conv-list", "⎇")
    page.fill("#search textarea, #search input", "Tab two")
    page.wait_for_function("() => !document.querySelector('#conv-list').innerText"
                           ".includes('⎇')")
    assert "Tab two is talking" in text(page, "#conv-list")
    page.fill("#search textarea, #search input", "")
    wait_text(page, "#conv-list", "⎇")
    page.click("#delete")
    wait_text(page, "#delete-question", "⎇")
    shot(page, "10-fork-delete-confirm")
    page.click("#delete-yes")
    page.wait_for_selector("#tab2-button", state="hidden")
    wait_text(page, "#conv-list", "⎇", present=False)

    # A model that cannot be had: a clear message, the current model stays.
    page.fill("#model-name textarea, #model-name input", "/no/such/model")
    page.click("#model-load")
    wait_text(page, "#model-status", "Could not load")
    assert "Still using" in text(page, "#model-status")
    assert "llama-long" in text(page, "#lp-header")
    assert "float32 · " in text(page, "#lp-header")          # the weights' format and size
    page.locator("#model-status").scroll_into_view_if_needed()
    shot(page, "11-model-not-found")

    # Reload: everything is still there, and the page is back on the tab it showed.
    on = shown_tab(page)
    page.reload()
    check_restored(page, on)
    shot(page, "12-reloaded")

    # Restart the app: everything is still there, on the tab last shown (once the server saved
    # that tab as the selected one: the click's event may still be on its way). The page is
    # closed first, as a user would: left open, its requests (the panel's long poll, Gradio's
    # streams, retrying while the server is gone) once held the navigation to the new server
    # without an answer for 30 s (a CI run; Chromium keeps 6 connections per host).
    on = shown_tab(page)
    saved_as_selected(app, on)
    page.goto("about:blank")
    app.stop()
    app.start()
    open_app(page, app)
    check_restored(page, on)
    shot(page, "13-restarted")
    assert page.evaluate("window.__pwned") is None        # no toast or panel ran the HTML
    assert not page.errors, page.errors
    print(f"walk-through took {time.monotonic() - t0:.0f} s")   # reported, not asserted


def saved_as_selected(app, i: int, timeout: float = 30.0) -> None:
    """Wait until the server's saved tabs (ui_state.json: the shown ones first, in order) have
    tab i's conversation as the selected one."""
    tabs = OpenTabsFile(app.data_dir / "ui_state.json")     # the app's own reader
    poll(lambda: tabs.read()[i:i + 1] == [tabs.read_current()], timeout,
         f"tab {i} saved as the selected one")


def check_restored(page, on: int) -> None:
    page.wait_for_selector(f"#msg{on} textarea", state="visible", timeout=60_000)
    page.click("#tab0-button")
    wait_text(page, "#chat0", "Tab one is talking")
    chat = text(page, "#chat0")
    assert "An edited first question" in chat and "Three ways to say hello" in chat
    assert "‹ 2/3 ›" in chat
    wait_text(page, "#conv-list", "Tab two is talking")
    page.click("#tab1-button")
    wait_text(page, "#chat1", "Tab two is talking")
    page.click("#tab0-button")
