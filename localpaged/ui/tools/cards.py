"""How tool steps show in the chat, as HTML for the Chatbot: a tool message is a collapsible card
(`<details class="lp-tool">`: the tool's name, its state and time in the summary; the arguments
as escaped code; the result rendered through `markdown.render`, the same allow-list as model
output, so a result cannot inject markup), and a reply that called tools says which.
Built from escaped text, numbers and fixed strings only.
"""

from __future__ import annotations

import html
import json

from .. import markdown
from ..store import Message

STATES = {"waiting": "⏸ waiting for your approval", "running": "⏳ running",
          "done": "✓ done", "error": "⚠ error", "denied": "✕ denied",
          "stopped": "■ stopped"}


def tool_card(msg: Message) -> str:
    """A tool message's card (open while it waits or runs, or when it failed)."""
    extra = msg.extra
    state = str(extra.get("state", "done"))
    bits = [html.escape(str(extra.get("name", "tool"))[:100], quote=False),
            STATES.get(state, html.escape(state, quote=False))]
    if isinstance(extra.get("duration_s"), (int, float)):
        bits.append(f"{float(extra['duration_s']):.2f} s")
    total = extra.get("total_chars")
    cut = ""
    if isinstance(total, int) and total > len(msg.content):
        cut = (f"<p><sub>cut: {len(msg.content):,} of {total:,} characters went back to the "
               "model and are shown here</sub></p>")
    opened = ' open=""' if state in ("waiting", "running", "error") else ""
    result = markdown.render(msg.content) if msg.content else ""
    return (f'<details class="lp-tool"{opened}><summary>🔧 {" · ".join(bits)}</summary>'
            f"<p><sub>arguments</sub></p><pre><code>{html.escape(_pretty(extra.get('arguments')), quote=False)}"
            f"</code></pre>{cut}{result}</details>")


def calls_note(msg: Message) -> str:
    """The line a reply that called tools adds under its text ("" when it called none)."""
    names = [str(c.get("name", "?"))[:100] for c in msg.extra.get("tool_calls") or []
             if isinstance(c, dict)]
    if not names:
        return ""
    return f"<p><sub>🔧 calls {html.escape(', '.join(names), quote=False)}</sub></p>"


def _pretty(arguments) -> str:
    """Arguments as indented JSON when they parse, else as they came."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(arguments or "")
