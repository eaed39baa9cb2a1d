"""The model manager in a real browser (the app as `python app.py`, Playwright + Chromium; the
helpers of tests/browser/test_ui_browser.py): a GGUF placed in a watched folder shows in the model list
with its size; choosing it and loading it shows the load's progress bar in the header, in view
at a 900-pixel-high window, counting up to 100%; the reply that follows names the model in its
footer. Screenshots: artifacts/ui/models-*.png."""

from __future__ import annotations

import os

import pytest
from test_ui_browser import browser_page, running_app, send, shot, text, wait_idle, wait_text

from helpers import ggml_models
from localpaged.runner.model_catalog import human_bytes

pytestmark = pytest.mark.slow

# Every value the header's percentage showed, recorded in the page as it changes.
RECORD_PERCENTS = """() => {
  window.__pcts = [];
  const head = document.querySelector('#lp-header');
  new MutationObserver(() => {
    const e = document.querySelector('#lp-load-pct');
    const last = window.__pcts[window.__pcts.length - 1];
    if (e && last !== e.innerText) window.__pcts.push(e.innerText);
  }).observe(head, {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def app(tiny_root, tmp_path_factory):
    yield from running_app(tiny_root, tmp_path_factory)


@pytest.fixture(scope="module")
def page(app):
    yield from browser_page("models-*.png")


def test_watched_gguf_listed_then_loaded_with_progress_to_100(app, page, tmp_path):
    page.set_viewport_size({"width": 1440, "height": 900})
    folder = tmp_path / "my-models"
    folder.mkdir()
    gguf = ggml_models.write_tiny_gguf(str(folder), tensor_type="Q8_0")
    file_name = os.path.basename(gguf)
    page.set_default_timeout(180_000)
    page.goto(app.url)
    page.wait_for_selector("#model-folder", state="visible", timeout=180_000)

    page.fill("#model-folder textarea, #model-folder input", str(folder))
    page.click("#model-add-folder")
    wait_text(page, "#model-folder-note", "1 GGUF file", timeout=120_000)
    wait_text(page, "#model-list", gguf)                     # its row: the path in "Load as"
    listed = text(page, "#model-list")          # the cells' text in order: name, format, size
    after = listed[listed.rindex(file_name, 0, listed.index(gguf)):].split("\n")
    assert after[1:3] == ["GGUF Q8_0", human_bytes(os.path.getsize(gguf))], listed
    page.locator("#model-list").scroll_into_view_if_needed()
    shot(page, "models-1-list")

    # Choose it: a click on its name (any cell of the row will do; the path's column may be
    # scrolled out of the narrow panel; Gradio's table also keeps a hidden copy of its cells).
    page.locator("#model-list").get_by_text(file_name, exact=True).filter(visible=True).first.click()
    page.wait_for_function("p => (document.querySelector('#model-name textarea, "
                           "#model-name input') || {}).value === p", arg=gguf, timeout=120_000)
    page.evaluate("window.scrollTo(0, 0)")
    page.evaluate(RECORD_PERCENTS)
    page.click("#model-load")
    bar = page.locator("#lp-load-bar")
    bar.wait_for(state="visible", timeout=60_000)
    box = bar.bounding_box()
    assert box and 0 <= box["y"] and box["y"] + box["height"] <= 900     # in view at 900 px
    shot(page, "models-2-loading")
    wait_text(page, "#model-status", "(100%)", timeout=120_000)
    wait_text(page, "#lp-header", file_name, timeout=60_000)    # the badge names the new model
    page.wait_for_function("() => window.__pcts.includes('100%')", timeout=30_000)
    percents = [int(p.rstrip("%")) for p in page.evaluate("window.__pcts")]
    assert percents == sorted(percents) and percents[-1] == 100, percents
    wait_text(page, "#lp-header", "100%", present=False, timeout=60_000)   # then the badge alone
    shot(page, "models-3-loaded")

    send(page, 0, "Hello there")
    wait_idle(page, 0)
    wait_text(page, "#chat0", file_name, timeout=120_000)     # the footer names the model
    shot(page, "models-4-reply")
    assert page.errors == []
