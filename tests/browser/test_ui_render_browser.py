"""Rendering in a real browser (Playwright, Debian's Chromium), the app started with
`--backend` on a local fake OpenAI-compatible server whose reply is chosen by the user's
message (REPLIES), so each case is exact text. Screenshots: artifacts/ui/render-*.png.

- A reply cut inside a code fence (finish_reason "length"): its footer, with the stop reason,
  is its own element after the message body, not inside the code block, and the code block's
  text holds none of it.
- Math: inline `$...$` / `\\(...\\)` and displayed `$$...$$` are typeset by KaTeX; prices stay
  text; hostile TeX (\\href{javascript:...}, \\url, \\htmlClass, \\includegraphics) makes no
  link, no class of its own and no request (KaTeX's trust stays off: error text instead).
- A reasoning block (`<think>`) is a collapsed <details>; a click on its summary opens it.
- `‹ 2/2 ›` in a message is clickable: its left half shows the previous version.
- The keyboard (ui/keyboard.py): `?` opens the shortcuts' help and Esc closes it; Tab from the
  message box goes to Send; Alt+← / Alt+→ switch versions; Ctrl+K focuses the search; Enter
  while a reply streams says the message is queued, Esc stops the reply, and the queued
  message is then sent; Alt+N opens a new chat.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from test_ui_browser import (ARTIFACTS, REPO, App, browser_page, text, wait_idle, wait_text)
from test_ui_untrusted import FakeOpenAI

pytestmark = pytest.mark.slow

CODE = "Here is the start:\n\n```python\ndef f():\n    return 1\n"
MATH = ("Euler: $e^{i\\pi}+1=0$ and \\(a^2+b^2=c^2\\), prices $5 and $10, then\n\n"
        "$$\\int_0^1 x\\,dx = \\frac{1}{2}$$\n\n")
HOSTILE = ("bad: $\\href{javascript:window.__pwned=1}{click me}$ "
           "$\\url{javascript:window.__pwned=2}$ $\\htmlClass{lp-pwned}{y}$ "
           "$\\includegraphics{{BASE}/leak/tex.png}$ end")
THINK = "<think>I plan *carefully* first.</think>The answer is **42**."
# message -> (reply, finish_reason)
REPLIES = {"code please": (CODE, "length"), "math please": (MATH + HOSTILE, "stop"),
           "think please": (THINK, "stop"), "slow please": ("slow " * 120, "stop")}
SLOW_CHUNK_S = 0.3                     # "slow please" streams for ~11 s (Esc stops it sooner)


class Scripted(FakeOpenAI):
    """FakeOpenAI's server, answering each message with its REPLIES entry."""

    def do_POST(self) -> None:
        self.paths.append(self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        last = (body.get("messages") or [{}])[-1].get("content", "")
        reply, finish = REPLIES.get(last, ("plain reply", "stop"))
        reply = reply.replace("{BASE}", self.base)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        base = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "fake-model"}
        pieces = [reply[k:k + 16] for k in range(0, len(reply), 16)]
        for k, piece in enumerate(pieces):
            if last == "slow please":
                time.sleep(SLOW_CHUNK_S)
            try:
                self.wfile.flush()
            except OSError:
                return                                       # the app stopped the reply
            delta = {"content": piece, **({"role": "assistant"} if k == 0 else {})}
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        done = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        self.wfile.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture(scope="module")
def fake():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    Scripted.base, Scripted.paths = f"http://127.0.0.1:{server.server_port}", []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Scripted
    server.shutdown()


@pytest.fixture(scope="module")
def app(fake, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("render-app")
    a = App("unused", tmp / "data", tmp / "app.log")
    a.cmd = [sys.executable, str(REPO / "app.py"), "--backend", fake.base + "/v1",
             "--data-dir", str(tmp / "data"), "--port", str(a.port)]
    a.start()
    yield a
    a.stop()


@pytest.fixture(scope="module")
def page(app):
    yield from browser_page("render-*.png")


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"render-{name}.png"))


def ask(page, message: str, footer: str) -> None:
    """Send `message` in tab 0 and wait until the chat shows `footer` and the reply ended."""
    page.fill("#msg0 textarea", message)
    page.click("#send0")
    wait_text(page, "#chat0", footer, timeout=60_000)
    wait_idle(page, 0)


LAST_BOT = "() => [...document.querySelectorAll('#chat0 [data-testid=bot]')].at(-1)"


def test_rendering_in_the_browser(app, page, fake):
    try:
        walk_through(page, app, fake)
    except Exception:
        shot(page, "failure")
        raise
    assert not [p for p in fake.paths if "/leak/" in p], fake.paths
    assert not page.errors, page.errors


def walk_through(page, app, fake) -> None:
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(app.url)
    page.wait_for_selector("#msg0 textarea", state="visible", timeout=60_000)

    # A reply cut inside a fence: the footer is its own element, outside the code.
    ask(page, "code please", "■ stopped")
    cut = page.evaluate(f"""() => {{ const b = ({LAST_BOT})();
        const foot = b.querySelector('.lp-foot'), pre = b.querySelector('.lp-body pre');
        return {{foot: foot && foot.innerText, inCode: !!(foot && foot.closest('pre, code')),
                 code: pre && pre.innerText, footAfterBody: !!(foot && foot.previousElementSibling
                 && foot.previousElementSibling.classList.contains('lp-body'))}}; }}""")
    assert "■ stopped" in cut["foot"] and not cut["inCode"] and cut["footAfterBody"], cut
    assert cut["code"].startswith("def f():") and "stopped" not in cut["code"], cut
    assert "sub" not in cut["code"] and "■" not in cut["code"]
    shot(page, "01-cut-fence")

    # Math: typeset by KaTeX; prices stay text; hostile TeX makes no link, class or request.
    ask(page, "math please", "prices")
    math = page.evaluate(f"""() => {{ const b = ({LAST_BOT})();
        return {{inline: b.querySelectorAll('.lp-math:not(.lp-math-display) .katex').length,
                 display: b.querySelectorAll('.lp-math-display .katex-display').length,
                 links: [...b.querySelectorAll('a')].map((a) => a.getAttribute('href')),
                 pwned: document.querySelectorAll('.lp-pwned').length,
                 imgs: b.querySelectorAll('img').length,
                 text: b.innerText}}; }}""")
    assert math["inline"] >= 3 and math["display"] == 1, math
    assert "prices $5 and $10" in math["text"], math["text"]
    assert math["links"] == [] and math["pwned"] == 0 and math["imgs"] == 0, math
    assert page.evaluate("() => window.__pwned") is None
    assert not [u for u in requests if "/leak/" in u]
    shot(page, "02-math")

    # Reasoning: collapsed, opened by a click on its summary.
    ask(page, "think please", "The answer is")
    think = page.locator("#chat0 [data-testid=bot] details.lp-think").last
    assert think.evaluate("d => d.open") is False
    inner = think.locator("p").first
    assert not inner.is_visible() and "The answer is 42." in text(page, "#chat0")
    think.locator("summary").click()
    page.wait_for_function("() => [...document.querySelectorAll('#chat0 details.lp-think')]"
                           ".at(-1).open")
    assert inner.is_visible() and "I plan carefully first." in inner.inner_text()
    shot(page, "03-think-open")

    # ‹ 2/2 › is clickable: regenerate, then a click on the marker's left half goes back.
    page.click("#regen0")
    wait_text(page, "#chat0", "‹ 2/2 ›", timeout=60_000)
    wait_idle(page, 0)
    marker = page.locator("#chat0 .lp-sib").last
    box = marker.bounding_box()
    page.mouse.click(box["x"] + 3, box["y"] + box["height"] / 2)
    wait_text(page, "#chat0", "‹ 1/2 ›")
    wait_text(page, "#sel0", "branch 1/2")
    marker = page.locator("#chat0 .lp-sib").last
    box = marker.bounding_box()
    page.mouse.click(box["x"] + box["width"] - 3, box["y"] + box["height"] / 2)
    wait_text(page, "#chat0", "‹ 2/2 ›")
    shot(page, "04-sibling-click")

    # The keyboard.
    page.locator("#msg0 textarea").focus()
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement?.id") == "send0"
    page.locator("#chat0").click(position={"x": 5, "y": 5})      # out of the text fields
    page.keyboard.press("?")
    page.locator("#lp-help").wait_for(state="visible")
    assert "Alt+N" in text(page, "#lp-help") and "regenerate" in text(page, "#lp-help")
    shot(page, "05-shortcuts")
    page.keyboard.press("Escape")
    page.locator("#lp-help").wait_for(state="hidden")
    page.keyboard.press("Alt+ArrowLeft")
    wait_text(page, "#chat0", "‹ 1/2 ›")
    page.keyboard.press("Alt+ArrowRight")
    wait_text(page, "#chat0", "‹ 2/2 ›")
    page.keyboard.press("Control+k")
    assert page.evaluate("() => !!document.activeElement?.closest('#search')")
    # Enter while a reply streams: queued (said so), Esc stops the reply, then it is sent.
    page.fill("#msg0 textarea", "slow please")
    page.click("#send0")
    wait_text(page, "#chat0", "slow slow", timeout=60_000)
    page.fill("#msg0 textarea", "after the slow one")
    page.locator("#msg0 textarea").press("Enter")
    page.locator("#lp-queued").wait_for(state="visible")
    shot(page, "06-queued")
    page.keyboard.press("Escape")
    wait_text(page, "#chat0", "■ stopped", timeout=30_000)
    wait_text(page, "#chat0", "after the slow one", timeout=30_000)
    wait_text(page, "#chat0", "plain reply", timeout=30_000)
    wait_idle(page, 0)
    page.locator("#lp-queued").wait_for(state="hidden")
    assert page.locator("#msg0 textarea").input_value() == ""
    page.keyboard.press("Alt+n")
    page.locator("#tab1-button").wait_for(state="visible")
    shot(page, "07-new-chat-by-key")
