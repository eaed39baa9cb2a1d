"""A reasoning model's reply in a real browser: the app started on the tiny model that never
closes its reasoning on its own (helpers/reasoning_models.py), driven by Playwright through
headless Chromium. Without a budget the reply streams into a folded reasoning block, open and
growing while it is written ("Thinking… (N tokens)", N rising), closed when done and opened and
closed again by a click on its summary. With the thinking budget set in the conversation
settings, the engine ends the reasoning and the answer comes: shown after the block ("Thought
for 8 tokens"), the answer the store holds. Screenshot: artifacts/ui/reasoning.png.
"""

from __future__ import annotations

import json
import re

import pytest
from helpers.reasoning_models import QUESTION, build_thinker

from test_ui_browser import (browser_page, configure, open_app, running_app, saved, send, shot,
                             wait_idle)

pytestmark = pytest.mark.slow

REPLIES = "SELECT content, status, stats, extra FROM messages WHERE role = 'assistant' ORDER BY id"

# Every summary of tab 0's reasoning blocks while the page runs, with whether its block was open.
WATCH_JS = """() => {
  window.__thinking = [];
  const chat = document.querySelector('#chat0');
  new MutationObserver(() => {
    for (const d of chat.querySelectorAll('details.lp-think')) {
      const s = d.querySelector('summary').innerText;
      const last = window.__thinking[window.__thinking.length - 1];
      if (!last || last[0] !== s) window.__thinking.push([s, d.open]);
    }
  }).observe(chat, {childList: true, subtree: true, characterData: true, attributes: true});
}"""

# The last reply's bubble: its reasoning block, and the text shown after it.
LAST_JS = """() => {
  const bots = document.querySelectorAll('#chat0 [data-testid=bot]');
  const bubble = bots[bots.length - 1];
  const d = bubble.querySelector('details.lp-think');
  if (!d) return null;
  let after = '', seen = false;
  const walk = document.createTreeWalker(bubble, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    if (d.contains(walk.currentNode)) { seen = true; continue; }
    if (seen) after += walk.currentNode.textContent;
  }
  return {summary: d.querySelector('summary').innerText, open: d.open, after: after};
}"""


@pytest.fixture(scope="module")
def app(tiny_root, tmp_path_factory):
    yield from running_app(tiny_root, tmp_path_factory, model=build_thinker(tiny_root))


@pytest.fixture(scope="module")
def page(app):
    yield from browser_page("reasoning*.png")


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_the_reasoning_block_streams_folds_and_the_budget_brings_the_answer(app, page):
    open_app(page, app)
    page.evaluate(WATCH_JS)
    send(page, 0, QUESTION)
    page.locator("#chat0 details.lp-think[open]").first.wait_for()
    wait_idle(page, 0)
    seen = page.evaluate("() => window.__thinking")
    counts = [int(m.group(1).replace(",", "")) for s, is_open in seen
              if (m := re.match(r"Thinking… \(([\d,]+) tokens?\)", s)) and is_open]
    assert len(counts) >= 2 and counts == sorted(counts) and counts[-1] > counts[0], seen
    [(content, status, stats, _)] = saved(app, REPLIES, lambda rows: len(rows) == 1
                                          and rows[0][1] == "complete")
    tokens = json.loads(stats)["reasoning_tokens"]
    assert content == "" and tokens > counts[-1]          # never closed: all of it reasoning
    last = page.evaluate(LAST_JS)
    assert last["summary"] == f"Thought for {tokens:,} tokens" and not last["open"]
    summary = page.locator("#chat0 details.lp-think summary").last
    summary.click()                                        # collapsible: opens, closes
    page.wait_for_function(f"() => ({LAST_JS})().open")
    summary.click()
    page.wait_for_function(f"() => !({LAST_JS})().open")

    configure(page, 0, app, reasoning_budget=8)
    send(page, 0, QUESTION[::-1])
    rows = saved(app, REPLIES, lambda rows: len(rows) == 2 and rows[1][1] == "complete",
                 timeout=60)
    wait_idle(page, 0)
    content, _, stats, extra = rows[1]
    assert json.loads(stats)["reasoning_tokens"] == 8 and json.loads(extra)["reasoning"]
    assert content.strip()                                 # the budget brought the answer
    last = page.evaluate(LAST_JS)
    assert last["summary"] == "Thought for 8 tokens" and not last["open"]
    assert _squeeze(content)[:12] in _squeeze(last["after"])  # the answer, after the block
    page.locator("#chat0 details.lp-think summary").last.click()
    page.wait_for_function(f"() => ({LAST_JS})().open")
    shot(page, "reasoning")
    assert page.errors == []
