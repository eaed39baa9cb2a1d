"""In a real browser (the app as `python app.py`, headless Chromium): a stdio MCP server written
here is added in the Tools panel and enabled in a conversation whose first step must call a
tool; the call asks for approval, runs, its card shows the tool's result, the turn ends with the
model's reply; after a restart on the same data directory the card is still there. Screenshots
in artifacts/ui-tools/.

The app runs a random Llama with SmolLM2's vocabulary (helpers/grammar_models.py): the engine's
grammar makes its call valid, which needs a vocabulary that can write the call's markup (the
other browser tests' tiny models have a toy vocabulary of a few hundred characters, without
`<` or `{`). The tool's argument has a length limit, so the random model's call ends within the
reply's tokens.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from test_ui_browser import (BROWSER_ARGS, CHROMIUM, REPO, App, configure, open_app, saved,
                             send, wait_idle, wait_text)

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "artifacts" / "ui-tools"
SERVER = '''
from typing import Annotated

from pydantic import Field
from mcp.server.mcpserver import MCPServer

server = MCPServer("demo")


@server.tool()
def shout(text: Annotated[str, Field(max_length=12)] = "") -> str:
    """Repeat the text in capitals."""
    return "TOOL-SAYS " + str(text).upper()[:40]


server.run()
'''


@pytest.fixture(scope="module")
def app(tmp_path_factory, require_part):
    from helpers.grammar_models import tiny_smol
    require_part(f"Chromium ({CHROMIUM})", os.path.exists(CHROMIUM),
                 "`apt-get install -y chromium`, done by scripts/setup.sh")
    require_part("the Python package playwright",
                 importlib.util.find_spec("playwright") is not None, "`pip install -e .[test]`")
    tmp = tmp_path_factory.mktemp("ui-tools-app")
    a = App(tiny_smol(str(tmp / "models")), tmp / "data", tmp / "app.log")
    a.start()
    yield a
    a.stop()


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


def test_mcp_tool_call_with_approval_survives_a_restart(app, page, tmp_path):
    try:
        walk(app, page, tmp_path)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "failure.png"))
        raise


def walk(app, page, tmp_path) -> None:
    server = tmp_path / "demo_server.py"
    server.write_text(SERVER)
    open_app(page, app)
    page.locator("#tools-panel").get_by_text("Tools (MCP servers)").click()
    page.fill("#tool-name input", "demo")
    page.fill("#tool-target input", f"{sys.executable} {server}")
    page.click("#tool-add")
    wait_text(page, "#tool-list", "shout", timeout=60_000)
    page.reload()                         # the tab's settings list the new server
    open_app(page, app)
    configure(page, 0, app, temperature=0, max_tokens=300)
    page.locator("#settings0").get_by_text("Conversation settings").click()
    page.locator("#tools0").get_by_text("demo", exact=True).click()
    page.locator("#toolfirst0").get_by_text("always call a tool").click()
    saved(app, "SELECT options FROM conversations",
          lambda rows: any('"first": "required"' in r[0] and '"servers": [1]' in r[0]
                           for r in rows))
    page.locator("#settings0").get_by_text("Conversation settings").click()

    send(page, 0, "Please shout hello")
    page.wait_for_selector("#approval0", state="visible", timeout=60_000)
    wait_text(page, "#approvaltext0", "shout")
    page.screenshot(path=str(ARTIFACTS / "01-approval.png"))
    page.click("#approve0")
    wait_text(page, "#chat0", "✓ done", timeout=60_000)
    wait_idle(page, 0)
    expect_result(page)
    rows = saved(app, "SELECT role, status FROM messages ORDER BY id",
                 lambda rows: [r[0] for r in rows][-3:] == ["assistant", "tool", "assistant"]
                 and all(r[1] == "complete" for r in rows))
    assert len(rows) == 4
    page.screenshot(path=str(ARTIFACTS / "02-card-and-reply.png"))

    app.stop()
    app.start()
    open_app(page, app)
    wait_text(page, "#chat0", "✓ done")
    expect_result(page)
    page.screenshot(path=str(ARTIFACTS / "03-after-restart.png"))


def expect_result(page) -> None:
    """The finished card is closed (its summary shows the tool and its state); opened, it shows
    the tool's result."""
    card = page.locator("#chat0 details.lp-tool")
    assert card.count() == 1 and card.get_attribute("open") is None
    card.locator("summary").click()
    wait_text(page, "#chat0", "TOOL-SAYS")
    assert "shout" in card.locator("summary").inner_text()
