"""Presets, defaults, Fork and "Stop and ask me" in a real browser: the app started as
`python app.py --max-model-len 200` with the tiny model (test_ui_browser's `running_app`),
driven by Playwright through Debian's Chromium. Screenshots: artifacts/ui/presets-*.png.

Steps: a preset fills the chat's system prompt; its settings (a repetition penalty among them)
become the defaults, and a new chat takes them; Fork copies the settings; under "Stop and ask
me" a conversation grown past the context opens the dialog, and each choice does what it says
(cancel: nothing sent, the text kept; edit: the text kept and focused; drop the oldest: sent
without them, the marker shows, the policy stays).
"""

from __future__ import annotations

import json

import pytest

from localpaged.ui.settings.presets import BUILT_IN
from test_ui_browser import (ARTIFACTS, browser_page, choose, saved, send, text, wait_idle,
                             wait_text)
from test_ui_browser_context import WORDS, app  # noqa: F401  (app: the same app fixture)

pytestmark = pytest.mark.slow
# The preset's system prompt takes ~70 of the 200 tokens (one per ASCII character): short turns.
SHORT = [w[:20] for w in WORDS]


@pytest.fixture(scope="module")
def page(app):
    yield from browser_page("presets-*.png")


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"presets-{name}.png"))


def field(page, i: int, name: str):
    return page.locator(f"#s{i}-{name} input").first


def set_field(page, i: int, name: str, value) -> None:
    box = field(page, i, name)
    box.fill(str(value))
    box.press("Tab")


def rows(app, sql: str):
    return saved(app, sql, lambda r: True)


def test_presets_defaults_fork_and_ask(app, page):
    try:
        walk_through(page, app)
    except Exception:
        shot(page, "failure")
        raise
    assert not page.errors, page.errors


def open_settings(page, i: int) -> None:
    page.locator(f"#settings{i}").get_by_text("Conversation settings").click()
    page.locator(f"#system{i} textarea").wait_for(state="visible")


def walk_through(page, app) -> None:
    page.goto(app.url)
    page.wait_for_selector("#msg0 textarea", state="visible", timeout=60_000)
    open_settings(page, 0)

    # A preset fills the system prompt (and saves it).
    prompt = BUILT_IN["Concise"]
    choose(page, "#preset0", "Concise",
           "p => document.querySelector('#system0 textarea').value === p", prompt)
    saved(app, "SELECT system_prompt FROM conversations", lambda r: (prompt,) in r)
    shot(page, "01-preset")

    # Its settings become the defaults; a new chat takes them.
    for name, value in (("max_tokens", 6), ("temperature", 0), ("repetition_penalty", 1.3)):
        set_field(page, 0, name, value)
        saved(app, "SELECT sampling FROM conversations", lambda r, n=name, v=value: any(
            json.loads(x[0]).get(n) == v for x in r), timeout=10)
    page.click("#defaults0")
    saved(app, "SELECT value FROM app_settings WHERE key = 'defaults'", lambda r: r and json.loads(
        r[0][0])["sampling"]["repetition_penalty"] == 1.3 and json.loads(r[0][0])[
        "system_prompt"] == prompt)
    page.click("#new-chat")
    page.locator("#tab1-button").wait_for(state="visible")
    open_settings(page, 1)
    page.wait_for_function("p => document.querySelector('#system1 textarea').value === p",
                           arg=prompt)
    assert float(field(page, 1, "repetition_penalty").input_value()) == 1.3
    assert float(field(page, 1, "max_tokens").input_value()) == 6
    shot(page, "02-new-chat-defaults")

    # Fork copies the settings: the forked chat shows the same system prompt and penalty.
    set_field(page, 1, "presence_penalty", 0.5)
    saved(app, "SELECT sampling FROM conversations", lambda r: any(
        json.loads(x[0]).get("presence_penalty") == 0.5 for x in r), timeout=10)
    send(page, 1, SHORT[0])
    wait_text(page, "#chat1", "tokens", timeout=60_000)
    wait_idle(page, 1)
    page.click("#fork1")
    page.locator("#tab2-button").wait_for(state="visible")
    wait_text(page, "#tab2-button", "⎇")
    convs = saved(app, "SELECT title, system_prompt, sampling FROM conversations", lambda r: any(
        t.startswith("⎇") for t, _, _ in r))
    fork = [c for c in convs if c[0].startswith("⎇")][0]
    assert fork[1] == prompt and json.loads(fork[2])["presence_penalty"] == 0.5
    assert json.loads(fork[2])["repetition_penalty"] == 1.3
    open_settings(page, 2)
    assert float(field(page, 2, "presence_penalty").input_value()) == 0.5
    shot(page, "03-fork-settings")

    # "Stop and ask me": grow tab 2's chat until the dialog opens.
    page.locator("#ctxpolicy2").get_by_text("Stop and ask me").click()
    saved(app, "SELECT context_policy FROM conversations", lambda r: ("error",) in r)
    for word in SHORT[1:]:
        n = len(rows(app, "SELECT id FROM messages"))
        send(page, 2, word)
        try:
            page.locator("#ask2").wait_for(state="visible", timeout=15_000)
            break
        except Exception:
            saved(app, "SELECT id FROM messages", lambda r, n=n: len(r) >= n + 2, timeout=60)
            wait_idle(page, 2)
    else:
        raise AssertionError("the dialog never opened")
    asked_word = word
    assert "no longer fits" in text(page, "#ask2")
    assert page.locator("#msg2 textarea").input_value() == asked_word
    before = rows(app, "SELECT id, content FROM messages ORDER BY id")
    shot(page, "04-ask-dialog")

    page.click("#askcancel2")                                   # cancel: nothing sent or lost
    page.locator("#ask2").wait_for(state="hidden")
    assert page.locator("#msg2 textarea").input_value() == asked_word
    assert rows(app, "SELECT id, content FROM messages ORDER BY id") == before

    page.click("#send2")                                        # edit: the text, focused
    page.locator("#ask2").wait_for(state="visible")
    page.click("#askedit2")
    page.locator("#ask2").wait_for(state="hidden")
    page.wait_for_function("() => document.activeElement?.closest('#msg2') !== null")
    assert page.locator("#msg2 textarea").input_value() == asked_word
    assert rows(app, "SELECT id, content FROM messages ORDER BY id") == before

    page.click("#send2")                                        # drop the oldest: sent
    page.locator("#ask2").wait_for(state="visible")
    page.click("#askdrop2")
    wait_text(page, "#chat2", "not in the model's context", timeout=60_000)
    wait_idle(page, 2)
    page.locator("#ask2").wait_for(state="hidden")
    assert page.locator("#msg2 textarea").input_value() == ""
    after = rows(app, "SELECT id, content FROM messages ORDER BY id")
    assert after[:len(before)] == before and after[len(before)][1] == asked_word
    dropped = rows(app, f"SELECT stats FROM messages WHERE id = {after[-1][0]}")
    assert json.loads(dropped[0][0])["context_dropped"] > 0
    assert ("error",) in rows(app, "SELECT context_policy FROM conversations")
    shot(page, "05-dropped-and-sent")
