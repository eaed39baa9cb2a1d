"""Organising chats in a real browser: the app as `python app.py` on the tiny model
(test_ui_browser's `running_app`), driven by Playwright through Debian's Chromium. Screenshots:
artifacts/ui/organise-*.png. No reply is generated: the conversation comes in by the UI's import.

Steps: a bad file is refused with a toast and changes nothing; an export is imported as a new
conversation (the others untouched) and opens on its active branch; a word that exists only in
the sibling branch is found by search, its snippet shown as text (the HTML in it never runs),
and a click opens that branch; Delete… asks first (Keep deletes nothing), then removes only
that reply; pin lists the chat first, archive hides it until "Show archived" is ticked.
"""

from __future__ import annotations

import json

import pytest

from localpaged.ui.store import EXPORT_FORMAT
from test_ui_browser import ARTIFACTS, browser_page, running_app, saved, text, wait_text

pytestmark = pytest.mark.slow
HTML = '<img src=x onerror="window.__pwned=1">'
SIBLING = f"Kyoto, for the zebracorn festival {HTML}"


@pytest.fixture(scope="module")
def app(tiny_root, tmp_path_factory):
    yield from running_app(tiny_root, tmp_path_factory)


@pytest.fixture(scope="module")
def page(app):
    yield from browser_page("organise-*.png")


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"organise-{name}.png"), timeout=120_000)


def export(title: str) -> dict:
    """A two-branch conversation: one question, the active reply and a sibling reply."""
    return {"format": EXPORT_FORMAT, "conversation": {"title": title, "active_root_id": "u"},
            "messages": [
                {"id": "u", "parent_id": None, "role": "user", "content": "Where to go in May?",
                 "active_child_id": "a"},
                {"id": "a", "parent_id": "u", "role": "assistant", "content": "Lisbon, surely."},
                {"id": "b", "parent_id": "u", "role": "assistant", "content": SIBLING}]}


def upload(page, path) -> None:
    """As choosing the file in the Import button's dialog does (its hidden file input)."""
    page.set_input_files("#lp-sidebar input[type=file]", str(path), timeout=120_000)


def rows(app, sql: str):
    return saved(app, sql, lambda r: True)


def test_import_search_delete_pin_archive(app, page, tmp_path):
    try:
        walk_through(app, page, tmp_path)
    except Exception:
        try:
            shot(page, "failure")
        except Exception as e:  # noqa: BLE001 - the walk-through's own error is the one to see
            print(f"no failure screenshot: {e}")
        raise
    assert not page.errors, page.errors


def walk_through(app, page, tmp_path) -> None:
    page.set_default_timeout(120_000)          # a shared 2-core machine: events take seconds
    page.goto(app.url)
    # A 2-core machine shared with other test runs may take a minute or more to lay it out.
    page.wait_for_selector("#msg0 textarea", state="visible", timeout=240_000)
    saved(app, "SELECT id FROM conversations", lambda r: len(r) == 1, 120)  # the first screen's
    everything = "SELECT id, title, updated FROM conversations ORDER BY id"
    before = rows(app, everything)

    # A bad file: refused whole, with the reason; nothing written.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**export("bad"), "messages": [{"id": 1, "role": "robot",
                                                              "content": "x"}]}))
    upload(page, bad)
    page.get_by_text("Not imported").first.wait_for(state="visible")
    assert "messages[0].role" in page.inner_text("body")
    assert rows(app, everything) == before
    shot(page, "01-bad-import")

    # A good one: a new conversation, opened on its active branch; the first one untouched.
    good = tmp_path / "trip.json"
    good.write_text(json.dumps(export("Trip ideas")))
    upload(page, good)
    wait_text(page, "#conv-list", "Trip ideas", timeout=120_000)
    after = rows(app, everything)
    assert after[:len(before)] == before and len(after) == len(before) + 1
    tab = page.locator("[id^=tab][id$=-button]").filter(has_text="Trip ideas")
    tab.wait_for(state="visible")
    i = int(tab.get_attribute("id")[3:-7])
    wait_text(page, f"#chat{i}", "Lisbon, surely.", timeout=120_000)
    assert "zebracorn" not in text(page, f"#chat{i}")
    shot(page, "02-imported")

    # Search finds the word only the sibling branch holds; the snippet is text.
    page.fill("#search textarea, #search input", "zebrac")
    hits = page.locator("#search-hits")
    wait_text(page, "#search-hits", "zebracorn", timeout=120_000)
    assert "<img" in hits.inner_text()                       # shown, not parsed
    assert hits.locator("img").count() == 0 and page.evaluate("window.__pwned") is None
    shot(page, "03-search-hit")
    hits.locator("label").first.click()
    wait_text(page, f"#chat{i}", "zebracorn festival", timeout=120_000)
    assert "Lisbon" not in text(page, f"#chat{i}") and "2/2" in text(page, f"#chat{i}")
    assert page.evaluate("window.__pwned") is None
    sibling = rows(app, "SELECT id FROM messages WHERE content LIKE 'Kyoto%'")[0][0]
    saved(app, "SELECT active_child_id FROM messages WHERE parent_id IS NULL AND content LIKE "
               "'Where%'", lambda r: r == [(sibling,)])
    shot(page, "04-hit-opened")

    # Delete… asks first; Keep deletes nothing; Delete removes only that reply.
    messages = "SELECT id, content FROM messages ORDER BY id"
    held = rows(app, messages)
    page.click(f"#delbranch{i}")
    wait_text(page, f"#delask{i}", "Delete this reply?", timeout=120_000)
    assert rows(app, messages) == held
    shot(page, "05-delete-asks")
    page.click(f"#delno{i}")
    page.locator(f"#delgroup{i}").first.wait_for(state="hidden")   # Gradio puts the id twice
    assert rows(app, messages) == held
    page.click(f"#delbranch{i}")
    wait_text(page, f"#delask{i}", "Delete this reply?", timeout=120_000)
    page.click(f"#delyes{i}")
    saved(app, messages, lambda r: r == [m for m in held if m[0] != sibling], 120)
    wait_text(page, f"#chat{i}", "Lisbon, surely.", timeout=120_000)
    assert "zebracorn" not in text(page, f"#chat{i}")
    shot(page, "06-branch-deleted")

    # Pin: listed first; archive: hidden until "Show archived".
    page.fill("#search textarea, #search input", "")
    page.locator("#conv-list label").filter(has_text="Trip ideas").click()
    page.click("#pin")
    wait_text(page, "#conv-list", "★ Trip ideas", timeout=120_000)
    assert page.locator("#conv-list label").first.inner_text().startswith("★")
    page.click("#archive")
    wait_text(page, "#conv-list", "Trip ideas", present=False, timeout=120_000)
    page.locator("#show-archived input").check()
    wait_text(page, "#conv-list", "archived", timeout=120_000)
    assert "★ Trip ideas" in text(page, "#conv-list")
    assert rows(app, "SELECT pinned, archived FROM conversations WHERE title = 'Trip ideas'") \
        == [(1, 1)]
    shot(page, "07-pinned-archived")
