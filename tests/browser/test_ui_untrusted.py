"""Untrusted output in a real browser: the chat app started with `--backend` on a local fake
OpenAI-compatible server whose reply is built to break a Markdown renderer: a Markdown image,
an <img>, a `javascript:` link, an ordinary link, a full-page `<b style="position:fixed">`
overlay, a fence whose info string holds a backtick, uneven inline-code backtick runs, a fence
indented in a list item, reference definitions with `\\]` in the label pointing at javascript:
and `/gradio_api/file=https://...`, a highlighted code block and an unclosed fence; every URL
points at the fake server's own /leak/ paths. The fake server records every path it is asked
for, and the browser records every request it sends.

The app runs with `--password`: the browser without credentials gets 401, with them (its Basic
login) the whole UI works. Checks: the reply renders; every element and attribute in the chat's
messages is on ui/markdown.py's allow-list (no style, no img), nothing covers the page, no
script ran; no request reaches /leak/ (neither from the browser nor anywhere else); the browser
asks nothing of any origin but the app's; links open in a new tab with rel="noopener
noreferrer"; the page carries the Content-Security-Policy and the browser reports no CSP
violation (Gradio works under it); Copy puts the reply's own Markdown on the clipboard, not the
HTML shown. Screenshot in artifacts/ui/untrusted.png, the messages' HTML beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from localpaged.api.guard import CSP
from localpaged.ui.store import DB_FILENAME
from localpaged.ui.markdown import ELEMENTS

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "ui"
PASSWORD = "let me in"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]


OVERLAY = '<b style="position:fixed;inset:0;background:red">'


def _reply(base: str) -> str:
    """Each construct that once got HTML past a Markdown escaper onto the page: a fence whose
    info string holds a backtick, code spans of unequal backtick runs, a fence indented in a
    list item, reference definitions with `\\]` in the label (a javascript: and a relative
    /gradio_api/file= destination); raw tags, an image and links; highlighted code."""
    return (f"Here you go ![secret chart]({base}/leak/md-image.png?q=the+secret) and "
            f'<img src="{base}/leak/html-img.png"> then [press me](javascript:window.__pwned=1) '
            f"or [the docs]({base}/leak/link) and {OVERLAY}overlay</b>\n\n"
            f'``x` <img src="{base}/leak/code-img.png">`` `\n\n'
            f"- item\n\n      ```\n  {OVERLAY}list-fence</b>\n  ```\n"
            f'<img src="{base}/leak/list-img.png">\n\n'
            f"[a\\]]: javascript:window.__pwned=3\n\n"
            f"[b\\]]: /gradio_api/file={base}/leak/file-link\n\n"
            f"[ref one][a\\]] [ref two][b\\]] ![ref img][b\\]]\n\n"
            "```python\nprint('<b>highlighted</b>')\n```\n\n"
            f"```x`\n{OVERLAY}fence-overlay</b>\n```\n\nbye")       # the last ``` opens a fence


# What the chat's message bodies may hold (the server's allow-list: the browser adds nothing),
# and what a script in the page collects from them: [tag, [attribute names]] per element.
SHOWN_ATTRIBUTES = {"href", "target", "rel", "class", "start"}
BODIES = "#chat0 [data-testid=bot] .md, #chat0 [data-testid=user] .md"
MESSAGE_ELEMENTS = f"""() => [...document.querySelectorAll('{BODIES}')].flatMap(
    b => [...b.querySelectorAll('*')].map(e => [e.tagName.toLowerCase(),
                                                [...e.attributes].map(a => a.name)]))"""
MESSAGES_HTML = f"""() => [...document.querySelectorAll('{BODIES}')].map(b => b.innerHTML)
    .join('\\n<!-- next message -->\\n')"""
# Whether anything in the page is fixed over the whole viewport (the overlay's aim).
OVERLAY_ON_TOP = """() => [...document.querySelectorAll('body *')].some(e => {
    const s = getComputedStyle(e), r = e.getBoundingClientRect();
    return s.position === 'fixed' && r.width >= innerWidth * .9 && r.height >= innerHeight * .9
        && s.visibility !== 'hidden' && s.display !== 'none' && e.innerText.includes('overlay'); })"""


class FakeOpenAI(BaseHTTPRequestHandler):
    """/v1/models and a streamed /v1/chat/completions; every path asked for is recorded."""
    paths: list[str] = []
    base = ""

    def log_message(self, *args) -> None:
        pass

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.paths.append(self.path)
        if self.path.rstrip("/").endswith("/v1/models"):
            return self._json({"object": "list", "data": [
                {"id": "fake-model", "object": "model", "created": 0, "owned_by": "test"}]})
        self.send_error(404)

    def do_POST(self) -> None:
        self.paths.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self.path.endswith("/v1/chat/completions"):
            return self.send_error(404)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        words = _reply(self.base).split(" ")
        base = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "fake-model"}
        for k, word in enumerate(words):
            delta = {"content": word + (" " if k < len(words) - 1 else "")}
            if k == 0:
                delta["role"] = "assistant"
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        done = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        usage = {**base, "choices": [], "usage": {"prompt_tokens": 5,
                                                  "completion_tokens": len(words),
                                                  "total_tokens": 5 + len(words)}}
        self.wfile.write(f"data: {json.dumps(done)}\n\ndata: {json.dumps(usage)}\n\n"
                         "data: [DONE]\n\n".encode())


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fake():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    FakeOpenAI.base = f"http://127.0.0.1:{server.server_port}"
    FakeOpenAI.paths = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield FakeOpenAI
    server.shutdown()


@pytest.fixture(scope="module")
def app_url(fake, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("untrusted") / "app.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--backend", fake.base + "/v1",
                             "--data-dir", str(log.parent / "data"), "--port", str(port),
                             "--password", PASSWORD],
                            cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 150
    while True:
        assert proc.poll() is None, f"the app exited:\n{log.read_text()[-3000:]}"
        try:
            urllib.request.urlopen(url + "config", timeout=2)
        except urllib.error.HTTPError as exc:
            assert exc.code == 401, exc                 # up, and asking for the login
            break
        except OSError:
            assert time.monotonic() < deadline, f"the app did not come up:\n{log.read_text()}"
            time.sleep(0.3)
    data = log.parent / "data"            # made by the app: private to this user
    assert data.stat().st_mode & 0o777 == 0o700 and (data / DB_FILENAME).stat().st_mode & 0o777 == 0o600
    yield url
    proc.terminate()
    proc.wait(30)


def test_a_hostile_reply_causes_no_request_and_no_script(fake, app_url):
    from playwright.sync_api import sync_playwright
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        anonymous = browser.new_page()
        with pytest.raises(Exception, match="ERR_INVALID_AUTH_CREDENTIALS"):
            anonymous.goto(app_url)                                # no login, no page
        anonymous.close()
        context = browser.new_context(viewport={"width": 1280, "height": 900},
                                      http_credentials={"username": "me", "password": PASSWORD})
        page = context.new_page()
        page.set_default_timeout(60_000)
        requests, console, errors = [], [], []
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            response = page.goto(app_url)
            assert response.headers.get("content-security-policy") == CSP
            page.wait_for_selector("#msg0 textarea", state="visible")
            page.fill("#msg0 textarea", "Show me the chart")
            page.click("#send0")
            page.wait_for_function("() => document.querySelector('#chat0').innerText"
                                   ".includes('bye')")
            # The stream is over when the reply's footer shows (no cursor left).
            page.wait_for_function("() => !document.querySelector('#chat0').innerText"
                                   ".includes('▌')")
            page.screenshot(path=str(ARTIFACTS / "untrusted.png"))
            chat = page.locator("#chat0")
            text = chat.inner_text()
            assert "🖼 image: secret chart (127.0.0.1" in text and "not loaded" in text
            assert '<img src="' in text                       # raw HTML stays text
            hrefs = chat.locator("a").evaluate_all(
                "as => as.map(a => [a.getAttribute('href'), a.target, a.rel])")
            assert not [h for h in hrefs if not (h[0] or "").startswith(("http://", "https://"))]
            docs = [h for h in hrefs if h[0] == fake.base + "/leak/link"]
            assert docs and docs[0][1] == "_blank" and set(docs[0][2].split()) >= \
                {"noopener", "noreferrer"}, hrefs
            imgs = chat.locator("img").evaluate_all("is => is.map(i => i.getAttribute('src'))")
            assert not [s for s in imgs if s and fake.base in s], imgs
            (ARTIFACTS / "untrusted-messages.html").write_text(page.evaluate(MESSAGES_HTML))
            elements = page.evaluate(MESSAGE_ELEMENTS)
            assert len(elements) > 20, elements            # the reply's markup is there
            outside = [e for e in elements if e[0] not in ELEMENTS
                       or set(e[1]) - SHOWN_ATTRIBUTES]
            assert not outside, outside
            assert not [e for e in elements if "style" in e[1] or e[0] == "img"], elements
            assert {"pre", "code", "span", "ul", "a", "sub"} <= {e[0] for e in elements}
            assert "overlay" in text and OVERLAY in text      # the tag itself shows as text
            assert not page.evaluate(OVERLAY_ON_TOP)
            assert page.evaluate("() => window.__pwned") is None
            # Copy puts the reply's own Markdown on the clipboard, not the HTML shown.
            context.grant_permissions(["clipboard-read", "clipboard-write"], origin=app_url)
            page.click("#copy0")
            deadline = time.monotonic() + 30
            while not (copied := page.evaluate("() => navigator.clipboard.readText()")):
                assert time.monotonic() < deadline, (console, page.evaluate(
                    "() => document.querySelector('#seltext0 textarea')?.value"))
                time.sleep(0.2)
            assert copied == _reply(fake.base)
        finally:
            browser.close()
    leaked = [pth for pth in fake.paths if "/leak/" in pth]
    assert not leaked, fake.paths
    assert set(fake.paths) <= {"/v1/models", "/v1/chat/completions"}, fake.paths
    foreign = [u for u in requests if not u.startswith((app_url, "data:", "blob:"))]
    assert not foreign, foreign
    csp_reports = [m for m in console if "Content Security Policy" in m]
    assert not csp_reports, csp_reports
    assert not errors, errors
