"""In a real browser (the app as `python app.py`, tiny model, headless Chromium; test_ui_browser's
`app` fixture, a fresh app for this module): 🔍 Tokens shows the selected reply token by token,
as many tokens as the store holds for it; a click on a token lists the alternatives the model
weighed there; "Branch from here" with another one writes a sibling reply that keeps the tokens
before it, puts the chosen one and goes on, shown as ‹ 2/2 ›. A user message has no token view.
"""

from __future__ import annotations

import json

import pytest

from test_ui_browser import (app, open_app, page, saved, send, shot,  # noqa: F401
                             wait_idle, wait_text)

pytestmark = pytest.mark.slow

REPLIES = ("SELECT id, token_ids, parent_id, status FROM messages WHERE role = 'assistant'"
           " ORDER BY id")


def test_branch_a_reply_at_a_token(app, page):
    open_app(page, app)
    send(page, 0, "ĀāĂăĄąĆć")
    wait_idle(page, 0)
    [(reply_id, ids, parent, _)] = saved(app, REPLIES, lambda rows: len(rows) == 1
                                         and rows[0][3] == "complete")
    wait_idle(page, 0)
    ids = json.loads(ids)
    page.click("#tokens0")
    page.wait_for_selector("#tokpanel0", state="visible")
    tokens = page.locator("#tokhtml0 .lp-tok")
    tokens.first.wait_for()
    assert tokens.count() == len(ids)
    index = min(5, len(ids) - 1)
    page.locator(f"#tokhtml0 .lp-t-{index}").click()
    page.wait_for_selector("#tokalts0", state="visible")
    page.locator("#tokhtml0 .lp-picked").wait_for()
    options = page.locator("#tokalts0 label")
    labels = [options.nth(k).inner_text() for k in range(options.count())]
    assert len(labels) == 5 and all(label.rstrip(" (this reply)").endswith("%") for label in labels)
    shot(page, "token-view")
    options.nth(next(k for k, label in enumerate(labels) if "(this reply)" not in label)).click()
    page.click("#tokbranch0")
    rows = saved(app, REPLIES, lambda rows: len(rows) == 2 and rows[1][3] == "complete")
    wait_idle(page, 0)
    branch = json.loads(rows[1][1])
    assert rows[1][2] == parent and branch[:index] == ids[:index] and branch[index] != ids[index]
    page.wait_for_selector("#tokpanel0", state="hidden")
    page.locator("#chat0").get_by_text("2/2").first.wait_for()

    page.locator("#chat0 [data-testid=user]").first.click()  # the user message: no tokens
    wait_text(page, "#sel0", "Your message 1 of 2")
    page.click("#tokens0")
    page.get_by_text("Select a reply first").first.wait_for()
    assert page.errors == []
