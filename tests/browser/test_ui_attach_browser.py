"""In a real browser (the app as `python app.py`, tiny model, headless Chromium; test_ui_browser's
`app` fixture, a fresh app for this module): a .txt file attached with 📎 Attach shows in the
composer's list by its name, goes with the next message (its text is in the stored message's
attachments, which the prompt carries after the message's own text), and the list empties and
hides once the message is sent. A file that is not text is a toast, and nothing is sent.
"""

from __future__ import annotations

import json

import pytest

from test_ui_browser import app, open_app, page, saved, send, wait_idle  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


def attach(page, path) -> None:
    """Pick a file with 📎 Attach (Gradio puts the button's file input beside it)."""
    page.locator("#attachbtn0").locator("xpath=..").locator("input[type=file]").set_input_files(
        str(path))


def chip(page, name: str):
    """An attached file's row in the composer's list."""
    return page.locator(f'#attach0 td.filename[aria-label="{name}"]')


def test_an_attached_text_file_goes_with_the_message(app, page, tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("The launch code is PINEAPPLE-42.\n")
    open_app(page, app)
    attach(page, note)
    page.wait_for_selector("#attach0", state="visible")
    chip(page, "note.txt").wait_for()
    send(page, 0, "What is in the note?")
    rows = saved(app, "SELECT content, extra FROM messages WHERE role = 'user'",
                 lambda rows: len(rows) == 1)
    content, extra = rows[0]
    assert content == "What is in the note?"
    [attached] = json.loads(extra)["attachments"]
    assert attached["name"] == "note.txt" and "PINEAPPLE-42" in attached["text"]
    page.wait_for_selector("#attach0", state="hidden")
    wait_idle(page, 0)

    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    attach(page, binary)
    chip(page, "blob.txt").wait_for()
    send(page, 0, "And this one?")
    page.get_by_text("blob.txt is not a text file").first.wait_for()
    saved(app, "SELECT count(*) FROM messages WHERE role = 'user'",
          lambda rows: rows[0][0] == 1)
    chip(page, "blob.txt").wait_for()                # still attached: fix it or remove it
