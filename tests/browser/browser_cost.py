"""The chat page's cost in Chromium, measured by the browser's own counters: an hour-like
session seeded into a store (`seed_store`: four conversations of ten messages, long replies with
code and LaTeX, all open as tabs), then `measure`:
  - idle: the renderer processes' CPU time (DevTools' SystemInfo.getProcessInfo) after a short
    reply in each tab and a forced major GC, as a share of one core: the median of
    IDLE_WINDOWS stretches, so that V8's memory reducer (a major GC some seconds after the page
    goes quiet, which can fill up to four windows) leaves the median alone where it still runs; the mean over all windows, the GC included, and
    each window's share are reported beside it;
  - four tabs streaming at once, the same;
  - Stop, clicked while the four stream: the time until the server logs it (the click's wall
    time in the page against the server's log line; one machine, one clock), in STOP_ROUNDS
    rounds of four fresh replies: the median, each round's beside it (one stray pause of the
    machine, a GC or a parked vCPU, moves one round, not the figure).
`measure_session` runs it on a fresh app; test_ui_page_cost.py asserts the page's goals on it,
bench/page_cost.py reports it.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path

from test_ui_browser import (App, browser_page, configure, long_context_model, renderer_cpu_s,
                             wait_idle, wait_text)

from localpaged.ui.store import DB_FILENAME, Store

N_TABS, MESSAGES_PER_TAB = 4, 10
IDLE_WINDOWS, IDLE_WINDOW_S = 11, 4.0
STOP_ROUNDS = 3
REPLY = ("Here is the derivation. For a geometric series $\\sum_{k=0}^{n} r^k = \\frac{1 - r^{n+1}}"
         "{1 - r}$, and in display form\n\n$$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$\n\n"
         "```python\ndef total(r, n):\n    return sum(r ** k for k in range(n + 1))\n```\n\n"
         + "A longer paragraph that keeps the reply the size a real one has. " * 12)


def seed_store(data_dir: Path) -> None:
    """Four conversations of MESSAGES_PER_TAB messages, open as the tabs, the first selected."""
    data_dir.mkdir(parents=True, exist_ok=True)
    store, cids = Store(data_dir / DB_FILENAME), []
    for n in range(N_TABS):
        conv = store.create_conversation(title=f"Session {n + 1}")
        parent = None
        for m in range(MESSAGES_PER_TAB):
            role = "user" if m % 2 == 0 else "assistant"
            text = f"Question {m // 2 + 1} about series?" if role == "user" else REPLY
            parent = store.add_message(conv.id, parent, role, text).id
        cids.append(conv.id)
    (data_dir / "ui_state.json").write_text(json.dumps({"open": cids, "current": cids[0]}))


def cpu_share(page, seconds: float) -> float:
    """The renderers' CPU time over the next `seconds` of wall time, as a share of one core."""
    before, t0 = renderer_cpu_s(page), time.monotonic()
    page.wait_for_timeout(seconds * 1000)
    return (renderer_cpu_s(page) - before) / (time.monotonic() - t0)


def collect_garbage(page) -> None:
    """A major GC of the page now, so that the one V8's memory reducer would run some seconds
    into the quiet (after the replies' garbage) is done before the idle windows start."""
    cdp = page.context.new_cdp_session(page)
    try:
        cdp.send("HeapProfiler.collectGarbage")
    finally:
        cdp.detach()


def idle_shares(page) -> tuple[float, float, list[float]]:
    """(median, mean, each window's in order) of the renderers' CPU share over IDLE_WINDOWS
    windows of IDLE_WINDOW_S: a failure shows whether one burst or the whole stretch was busy."""
    shares = [cpu_share(page, IDLE_WINDOW_S) for _ in range(IDLE_WINDOWS)]
    ranked = sorted(shares)
    return ranked[len(ranked) // 2], sum(shares) / len(shares), shares


def stop_received_at(app, cid: int, after: int) -> float:
    """The wall time of the server's log line for the stop of conversation `cid` (the log's
    lines past offset `after`)."""
    pattern = re.compile(r"^(\S+ \S+) .*stop of conversation (\d+) received", re.M)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for stamp, got in pattern.findall(app.log.read_text()[after:]):
            if int(got) == cid:
                return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        time.sleep(0.05)                  # a polling interval, under a deadline
    raise AssertionError(f"the server never logged the stop of conversation {cid}")


def send(page, i: int, text: str) -> None:
    """Send `text` in tab i (its box can be typed in while the tab is shown)."""
    page.click(f"#tab{i}-button")
    page.fill(f"#msg{i} textarea", text)
    page.click(f"#send{i}")


def measure(app, page) -> dict:
    page.goto(app.url)
    for i in range(N_TABS):
        wait_text(page, f"#tab{i}-button", f"Session {i + 1}", timeout=180_000)
    wait_text(page, "#engine-panel", "In use", timeout=180_000)
    wait_text(page, "#chat0", "derivation")
    for i in range(N_TABS):        # a short reply in each tab, as in a real session: Gradio
        page.click(f"#tab{i}-button")      # keeps every input of every event that ended,
        configure(page, i, app, temperature=0, max_tokens=16)  # and goes over them per chunk
        send(page, i, "A short question")
        wait_idle(page, i)
    page.click("#tab0-button")
    page.wait_for_timeout(3000)                              # the screen settles
    collect_garbage(page)
    idle, idle_mean, idle_windows = idle_shares(page)

    for i in range(N_TABS):                                  # long replies, so all four stream
        page.click(f"#tab{i}-button")
        configure(page, i, app, max_tokens=4000)
    streaming, stops = None, []
    for round_ in range(STOP_ROUNDS):
        for i in range(N_TABS):
            send(page, i, f"Question {round_ + 1} more for session {i + 1}")
        page.click("#tab0-button")
        page.wait_for_function("(n) => [...Array(n).keys()].every(i => document.querySelector("
                               "'#tab' + i + '-button').innerText.startsWith('●'))", arg=N_TABS)
        if streaming is None:
            streaming = cpu_share(page, 8)
        else:
            page.wait_for_timeout(2000)                      # all four well under way
        stops.append(stop_latency(app, page))
        for i in range(1, N_TABS):
            page.evaluate(f"() => document.querySelector('#stop{i}').click()")
        for i in range(N_TABS):
            wait_idle(page, i)
    return {"idle_core_share": idle, "idle_core_share_mean": idle_mean,
            "idle_windows": [round(w, 4) for w in idle_windows],
            "streaming_4_tabs_core_share": streaming,
            "stop_to_server_s": sorted(stops)[len(stops) // 2],
            "stop_to_server_each_s": [round(s, 4) for s in stops]}


def stop_latency(app, page) -> float:
    """Click tab 0's Stop while the four tabs stream: seconds until the server logs it."""
    offset = len(app.log.read_text())
    clicked = page.evaluate("() => { const t = Date.now() / 1000; "
                            "document.querySelector('#stop0').click(); return t; }")
    cid = json.loads((app.data_dir / "ui_state.json").read_text())["open"][0]
    return stop_received_at(app, cid, offset) - clicked


def measure_session(root: Path, start_timeout: float) -> dict:
    """`measure` on a fresh app over a seeded session, everything under `root` (the tiny model
    included): the app and the browser are stopped afterwards."""
    data_dir = root / "data"
    seed_store(data_dir)
    app = App(long_context_model(str(root)), data_dir, root / "app.log")
    app.start(start_timeout)
    pages = browser_page("page-cost-*.png")
    try:
        page = next(pages)
        page.set_default_timeout(180_000)
        return measure(app, page)
    finally:
        pages.close()
        app.stop()
