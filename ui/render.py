"""Turning controller data into what Gradio components show: Chatbot messages (escaped
Markdown, `‹ 2/3 ›` markers at branch points, a stats line under each reply), sidebar choices
and the small status texts.

Safety: chat text is untrusted, and rendering it must never make the browser send a request.
Outside code spans and fenced blocks, `&`, `<` and `>` are escaped, so HTML and scripts in a
message show as text (inside code, Markdown itself escapes); a Markdown image becomes a link-text
placeholder naming its host (never loaded); a link whose destination is not http(s) loses its
link syntax (no javascript:, data:, relative or obfuscated URLs), and so does a reference
definition. The Chatbot's own sanitizer and the page's Content-Security-Policy (api/guard.py)
stay on as further lines of defence. The only markup added here is built from numbers and
fixed strings.
"""

from __future__ import annotations

import html
import re
import time
from typing import Any

from localpaged.engine.outputs import FINISH_DETAILS, NATURAL_ENDS

from .controller import View
from .store import Conversation, Message
from .turns import LiveReply

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
# ![alt](<url> "title"): alt without unescaped brackets, url without spaces or parentheses.
_IMAGE = re.compile(r"!\[((?:[^\[\]\\]|\\.)*)\]\(\s*<?([^\s<>()]*)>?"
                    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
_LINK_OPEN = re.compile(r"\]\(\s*")                      # where an inline link's destination starts
_REF_DEF = re.compile(r"^( {0,3})\[(?=[^\]]+\]:\s*)")    # "[label]: destination" at a line start
_HTTP = re.compile(r"<?https?://", re.I)
STATUS_NOTES = {"stopped": "■ stopped", "interrupted": "⚠ interrupted (the app stopped)",
                "streaming": "…"}
PREPARED_NOTE = "⚡ prepared in the background"


def escape_markdown(text: str) -> str:
    """Escape HTML in Markdown text except inside code (fenced blocks and inline spans),
    which Markdown renders literally. An unclosed fence (a streaming reply) runs to the end."""
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        m = _FENCE.match(line)
        if fence is not None:
            out.append(line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line.strip().strip(fence[0]):
                fence = None
        elif m:
            fence = m.group(1)
            out.append(_escape_info(line, m.end()))
        else:
            out.append(_escape_inline(line))
    return "\n".join(out)


def _escape_info(line: str, end: int) -> str:
    """A fence line: the fence stays, its info string (language name) is escaped."""
    return line[:end] + html.escape(line[end:], quote=True)


def _escape_inline(line: str) -> str:
    m = _REF_DEF.match(line)
    if m and not _HTTP.match(line[line.index("]:") + 2:].lstrip()):
        line = m.group(1) + "\\" + line[len(m.group(1)):]     # "\[label]: ..." is plain text
    parts, pos = [], 0
    for m in _INLINE_CODE.finditer(line):
        parts.append(_defuse(html.escape(line[pos:m.start()], quote=False)))
        parts.append(m.group(0))
        pos = m.end()
    parts.append(_defuse(html.escape(line[pos:], quote=False)))
    return "".join(parts)


def _defuse(text: str) -> str:
    """Markdown text (outside code) with no image and no non-http(s) inline link left."""
    text = _IMAGE.sub(_image_placeholder, text)
    text = text.replace("![", "!\\[")                      # any other image form: not an image
    return _LINK_OPEN.sub(lambda m: m.group(0) if _HTTP.match(text, m.end())
                          else "\\" + m.group(0), text)


def _image_placeholder(m: re.Match) -> str:
    """`![alt](url)` -> `[🖼 image: alt (host.example, not loaded)](url)`: a link the user may
    click (a new tab), never an image the browser fetches; text only when url is not http(s)."""
    alt, url = m.group(1).strip() or "image", m.group(2)
    if not _HTTP.match(url):
        return f"🖼 image: {alt} (not loaded)"
    host = re.sub(r"^<?https?://", "", url, flags=re.I).split("/")[0].split("?")[0]
    host = re.sub(r"[\[\]()\\`*_]", "", host)
    return f"[🖼 image: {alt} ({host}, not loaded)]({url})"


def fmt_stats(stats: dict[str, Any]) -> str:
    """`42 tokens · TTFT 0.12 s · 31.5 tok/s · prefill skipped: 32 tokens` (only what is known)."""
    bits = []
    if stats.get("generated_tokens") is not None:
        bits.append(f"{int(stats['generated_tokens'])} tokens")
    if stats.get("ttft_s") is not None:
        bits.append(f"TTFT {float(stats['ttft_s']):.2f} s")
    if stats.get("tokens_per_s") is not None:
        bits.append(f"{float(stats['tokens_per_s']):.1f} tok/s")
    if stats.get("prefix_tokens_reused"):
        bits.append(f"prefill skipped: {int(stats['prefix_tokens_reused'])} tokens")
    return " · ".join(bits)


def footer(msg: Message, pos: tuple[int, int], live: LiveReply | None = None) -> str:
    """The line under a message: branch marker, then (replies) status and stats."""
    bits = [f"‹ {pos[0]}/{pos[1]} ›"] if pos[1] > 1 else []
    if msg.role == "assistant":
        status = live.status if live else msg.status
        stats = live.stats if live else msg.stats
        if msg.prepared:
            bits.append(PREPARED_NOTE)
        detail = stats.get("finish_detail")
        if status == "stopped" and detail not in (None, "abort") and detail not in NATURAL_ENDS:
            bits.append(f"■ stopped: {FINISH_DETAILS.get(detail, detail)}")
        elif status != "complete":
            bits.append(STATUS_NOTES.get(status, status))
        elif detail and detail not in NATURAL_ENDS:      # length, memory: it can go on
            bits.append(f"■ stopped: {FINISH_DETAILS.get(detail, detail)}")
        if stats.get("error"):
            bits.append("error: " + str(stats["error"])[:200])
        if fmt_stats(stats):
            bits.append(fmt_stats(stats))
    return _defuse(html.escape(" · ".join(bits), quote=False))    # errors may quote a server


def chat_messages(view: View) -> list[dict[str, str]]:
    """One Chatbot message per message on the active path (index i is view.path[i])."""
    out = []
    cut = context_cut(view)
    for i, (msg, pos) in enumerate(zip(view.path, view.siblings)):
        live = view.live.get(msg.id)
        text = live.text if live else msg.content
        body = escape_markdown(text)
        if live and live.status == "streaming" and not text and live.progress:
            body = prefill_note(*live.progress)
        elif live and live.status == "streaming":
            body += " ▌"
        elif not text and msg.role == "assistant":
            body = "*(empty reply)*"
        note = footer(msg, pos, live)
        if note:
            body += f"\n\n<sub>{note}</sub>"
        if cut and i == cut:
            body = f"<sub>{context_marker(cut)}</sub>\n\n{body}"
        out.append({"role": msg.role, "content": body})
    return out


def context_cut(view: View) -> int:
    """How many messages at the top of the shown path the latest reply's prompt left out
    (the marker goes on the first message it kept); 0 when it sent the whole path."""
    for msg in reversed(view.path):
        if msg.role == "assistant":
            n = int(msg.stats.get("context_dropped") or 0)
            return n if 0 < n < len(view.path) else 0
    return 0


def context_marker(n: int) -> str:
    return (f"✂ {n} earlier message{'s are' if n != 1 else ' is'} not in the model's context"
            " (still saved here)")


def prefill_note(done: int, total: int) -> str:
    """What a reply shows while its prompt is prefilled in chunks."""
    return f"*reading the conversation: {done:,} / {total:,} tokens…*"


def selection_label(view: View, index: int | None) -> str:
    """Markdown for the message toolbar: which message the buttons act on."""
    if index is None or not 0 <= index < len(view.path):
        return "*No messages yet: type below.*"
    msg, (k, n) = view.path[index], view.siblings[index]
    who = "Your message" if msg.role == "user" else "Reply"
    branch = f" · branch **{k}/{n}**" if n > 1 else ""
    return f"{who} {index + 1} of {len(view.path)}{branch}"


def conversation_choices(convs: list[Conversation]) -> list[tuple[str, int]]:
    """Sidebar entries (Gradio shows labels as text, never HTML)."""
    return [(f"{c.title}  ·  {_age(c.updated)}", c.id) for c in convs]


def tab_label(conv: Conversation | None, busy: bool = False) -> str:
    if conv is None:
        return "—"
    title = conv.title if len(conv.title) <= 22 else conv.title[:21] + "…"
    return ("● " if busy else "") + title


def _age(ts: float) -> str:
    s = max(0, time.time() - ts)
    if s < 60:
        return "now"
    if s < 3600:
        return f"{int(s // 60)} min"
    if s < 86400:
        return f"{int(s // 3600)} h"
    return time.strftime("%d %b", time.localtime(ts))
