"""The README's screenshots of the chat, taken from the app as a user runs it on the bundled
SmolLM2 (offline), in headless Chromium through Playwright: a reply's tokens with the
alternatives at one of them (🔍 Tokens), Think N ways in Compare, and a compacted conversation.
Writes docs/img/{tokens,think-n-ways,compact}.png. The reasoning block's shot
(docs/img/reasoning.png) is the one tests/browser/test_ui_reasoning_browser.py takes of a tiny
random reasoning model (artifacts/ui/reasoning.png): the bundled model does not reason.

    .venv/bin/python scripts/readme_shots.py [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "img"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(data_dir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--data-dir", data_dir,
                             "--port", str(port)], cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc, url
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit("the app did not come up")


def idle(page, i: int = 0) -> None:
    page.wait_for_function(f"() => !document.querySelector('#chat{i}').innerText.includes('▌')"
                           f" && !document.querySelector('#tab{i}-button').innerText"
                           ".includes('●')", timeout=300_000)


def send(page, text: str, i: int = 0) -> None:
    page.fill(f"#msg{i} textarea", text)
    page.click(f"#send{i}")
    page.wait_for_timeout(500)
    idle(page, i)


def setting(page, name: str, value, i: int = 0) -> None:
    page.locator(f"#settings{i}").get_by_text("Conversation settings").click()
    box = page.locator(f"#s{i}-{name} input").first
    box.fill(str(value))
    box.press("Tab")
    page.wait_for_timeout(800)
    page.locator(f"#settings{i}").get_by_text("Conversation settings").click()


def shots(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#msg0 textarea", state="visible", timeout=300_000)
    page.get_by_text("In use").first.wait_for(timeout=300_000)
    setting(page, "max_tokens", 120)
    send(page, "Give me three short tips for writing clear emails.")
    page.click("#tokens0")
    tokens = page.locator("#tokhtml0 .lp-tok")
    tokens.first.wait_for()
    page.locator("#tokhtml0 .lp-t-12").click()
    page.wait_for_selector("#tokalts0", state="visible")
    page.locator("#tokpanel0").first.screenshot(path=str(OUT / "tokens.png"))
    page.locator("#tokclose0").first.click()

    page.click("#tab-compare-button")
    page.wait_for_selector("#cmp-prompt textarea", state="visible")
    page.locator("#cmp-k label", has_text="4").click()
    page.locator("#cmp-think input").check()
    margin = page.locator("#cmp-margin input")
    margin.fill("0.15")
    margin.press("Tab")
    page.fill("#cmp-prompt textarea", "Tom has 17 apples and buys 25 more. How many apples does "
              "he have? Explain briefly, then end with 'Answer: <number>'.")
    page.click("#cmp-run")
    page.wait_for_function("() => /Majority vote|No short final answers/.test("
                           "document.querySelector('#cmp-summary').innerText)", timeout=300_000)
    page.screenshot(path=str(OUT / "think-n-ways.png"), full_page=False)

    page.get_by_role("tab").first.click()
    for q in ("What is a good name for a cat?", "And for a dog?", "Why do cats purr?"):
        send(page, q)
    page.click("#compact0")
    note = page.locator("#chat0").get_by_text("compacted; the original")
    note.first.wait_for(timeout=300_000)
    idle(page)
    note.first.scroll_into_view_if_needed()
    page.screenshot(path=str(OUT / "compact.png"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chromium", default=os.environ.get("LOCALPAGED_CHROMIUM", "/usr/bin/chromium"))
    args = ap.parse_args()
    from PIL import Image
    from playwright.sync_api import sync_playwright
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as data:
        proc, url = start_app(data)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium, headless=True,
                                            args=ARGS)
                page = browser.new_page(viewport={"width": 1440, "height": 960})
                page.set_default_timeout(60_000)
                shots(page, url)
        finally:
            proc.terminate()
            proc.wait(30)
    for png in OUT.glob("*.png"):            # 256 colours: a third of the bytes, same look
        Image.open(png).convert("RGB").quantize(256).save(png, optimize=True)
    print(f"wrote {', '.join(str(p.relative_to(REPO)) for p in sorted(OUT.glob('*.png')))}")


if __name__ == "__main__":
    main()
