"""Turning controller data into what Gradio components show: Chatbot messages (HTML from
`markdown.render`, `‹ 2/3 ›` markers at branch points, a stats line under each reply), sidebar
choices and the small status texts.

Safety: chat text is untrusted; `markdown.py` owns the rule (an allow-list of elements and
attributes, no image ever loaded, http(s) links only). The Chatbot gets HTML (its own Markdown
parser is off), so the server is the only Markdown parser. The markup added here: each message
is `<div class="lp-body">` (its Markdown, rendered: balanced HTML, so a reply cut inside a code
fence has its `</pre>` before anything after it) then `<div class="lp-foot"><sub>` (the footer,
built from numbers, fixed strings and escaped text; never part of the message's Markdown, so
never inside its code), and the context marker's `<sub>`. The branch marker `‹ 2/3 ›` is a
`<span class="lp-sib lp-at-{index}">`: a click on its ‹ or › switches siblings (SIBLING_JS
in chat/message_events.py reads the index from the class). A reply's reasoning (kept apart from
its text: turns.py) comes first, folded (`markdown.think_block`: "Thought for N tokens"), open while it
streams. A user message's images come before its text as the app's own thumbnails
(`images/view.py`: links to the app's image route, never from the message's text).
"""

from __future__ import annotations

import html
import time
from typing import Any

from localpaged.engine.outputs import FINISH_DETAILS, NATURAL_ENDS

from . import markdown
from .controller import View
from .images.logic import footer_note as image_note
from .images.view import thumbnails
from .tools.cards import calls_note, tool_card
from .store import Conversation, Message
from .live_reply import LiveReply

STATUS_NOTES = {"stopped": "■ stopped", "interrupted": "⚠ interrupted (the app stopped)",
                "streaming": "…"}
PREPARED_NOTE = "⚡ prepared in the background"
COPY_NOTE = "⧉ copied from the original branch (not generated here)"
CURSOR = " ▌"


def fmt_stats(stats: dict[str, Any]) -> str:
    """`42 tokens · TTFT 0.12 s · 31.5 tok/s · prefill skipped: 32 tokens (16 from disk) ·
    drafted 12, accepted 9` (only what is known)."""
    bits = []
    if stats.get("generated_tokens") is not None:
        bits.append(f"{int(stats['generated_tokens'])} tokens")
    if stats.get("ttft_s") is not None:
        bits.append(f"TTFT {float(stats['ttft_s']):.2f} s")
    if stats.get("tokens_per_s") is not None:
        bits.append(f"{float(stats['tokens_per_s']):.1f} tok/s")
    if stats.get("prefix_tokens_reused"):
        disk = int(stats.get("prefix_tokens_from_disk") or 0)
        bits.append(f"prefill skipped: {int(stats['prefix_tokens_reused'])} tokens"
                    + (f" ({disk} from disk)" if disk else ""))
    if stats.get("draft_tokens"):
        bits.append(f"drafted {int(stats['draft_tokens'])}, accepted "
                    f"{int(stats.get('accepted_draft_tokens') or 0)}")
    pruned = stats.get("pruned")
    if isinstance(pruned, dict):          # parallel thinking: why the branch stopped
        bits.append(f"pruned at token {int(pruned['at'])}: mean logprob "
                    f"{float(pruned['score']):.2f} against the best {float(pruned['best']):.2f}")
    if stats.get("released_blocks"):
        bits.append(f"gave back {int(stats['released_blocks'])} KV blocks")
    return " · ".join(bits)


def footer(msg: Message, pos: tuple[int, int], live: LiveReply | None = None,
           index: int | None = None) -> str:
    """The line under a message (HTML): branch marker, then (replies) status and stats. With
    the message's `index` on the path, the marker is clickable (its own span)."""
    note = _note(msg, live)
    if pos[1] <= 1:
        return note
    marker = f"‹ {pos[0]}/{pos[1]} ›"
    if index is not None:
        marker = f'<span class="lp-sib lp-at-{int(index)}">{marker}</span>'
    return marker + (" · " + note if note else "")


def _note(msg: Message, live: LiveReply | None) -> str:
    """A reply's status and stats, escaped; "" for a user message."""
    bits: list[str] = []
    if msg.role == "user" and msg.extra.get("attachments"):
        bits.append(attachments_note(msg.extra["attachments"]))
    if "summary_of" in msg.extra:
        bits.append(summary_note(msg.extra["summary_of"],
                                 writing=live is not None and live.status == "streaming"))
        if msg.status == "interrupted":          # the app stopped while it was written
            bits.append(STATUS_NOTES["interrupted"])
    if "copy_of" in msg.extra:
        bits.append(COPY_NOTE)
    if msg.role == "assistant":
        status = live.status if live else msg.status
        stats = live.stats if live else msg.stats
        if msg.prepared:
            bits.append(PREPARED_NOTE)
        detail = stats.get("finish_detail")
        if detail is None and stats.get("finish_reason") == "length":
            detail = "max_tokens"          # a remote server says only OpenAI's reason
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
        if image_note(stats):
            bits.append(image_note(stats))
        model = stats.get("model") or msg.stats.get("model")   # live stats: the engine's only
        if model:
            bits.append(model_label(str(model)))
    return html.escape(" · ".join(bits), quote=False)   # errors may quote a server


def summary_note(summary_of, writing: bool = False) -> str:
    """`📝 Summary of 6 earlier messages (the original is the other branch here: ‹ ›)`; while
    the model writes it, `📝 Writing a summary of 6 earlier messages…`."""
    n = len(summary_of) if isinstance(summary_of, list) else 0
    what = f"{n} earlier message{'s' if n != 1 else ''}"
    if writing:
        return (f"📝 Writing a summary of {what}… (Stop leaves the conversation as it was)")
    return (f"📝 Summary of {what} (compacted; the original is the other branch here: ‹ ›)")


def attachments_note(attachments: list) -> str:
    """`📎 notes.txt (1,204 characters), spec.pdf (PDF, 9,310 characters)`: what a user message
    carries into the prompt (the text itself is in the prompt, not shown)."""
    names = []
    for att in attachments:
        if isinstance(att, dict):
            kind = "PDF, " if att.get("kind") == "pdf" else ""
            names.append(f"{str(att.get('name', 'file'))[:80]} ({kind}{len(str(att.get('text', ''))):,} characters)")
    return "📎 " + ", ".join(names)


def model_label(name: str) -> str:
    """The model that wrote a reply, as its footer names it: a Hub id whole, a path by its last
    part ("/models/tiny.gguf" -> "tiny.gguf"), at most 80 characters."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        name = name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return name if len(name) <= 80 else name[:79] + "…"


def chat_messages(view: View) -> list[dict[str, str]]:
    """One Chatbot message (HTML) per message on the active path (index i is view.path[i])."""
    out = []
    cut = context_cut(view)
    for i, (msg, pos) in enumerate(zip(view.path, view.siblings)):
        live = view.live.get(msg.id)
        if msg.role == "tool":
            inner = tool_card(msg)
        else:
            inner = reasoning_html(msg, live) + markdown.render(_source(msg, live)) \
                + calls_note(msg)
            if msg.role == "user":
                inner = thumbnails(msg.extra) + inner
        body = f'<div class="lp-body">{inner}</div>'
        note = footer(msg, pos, live, index=i)
        if note:
            body += f'<div class="lp-foot"><sub>{note}</sub></div>'
        if cut and i == cut:
            body = f"<sub>{html.escape(context_marker(cut), quote=False)}</sub>{body}"
        role = "assistant" if msg.role in ("tool", "system") else msg.role
        out.append({"role": role, "content": body})
    return out


def reasoning_html(msg: Message, live: LiveReply | None) -> str:
    """A reply's reasoning as a folded block ("" without one); the cursor is in it while the
    reasoning streams."""
    reasoning = live.reasoning if live else str(msg.extra.get("reasoning") or "")
    if not reasoning:
        return ""
    stats = live.stats if live else msg.stats
    tokens = int(stats.get("reasoning_tokens") or 0)
    thinking = live is not None and live.status == "streaming" and not live.text
    count = f"{tokens:,} token{'s' if tokens != 1 else ''}"
    if thinking:
        summary = f"Thinking… ({count})" if tokens else "Thinking…"
    else:
        summary = f"Thought for {count}" if tokens else "Thought"
    return markdown.think_block(reasoning + (CURSOR if thinking else ""), summary, thinking)


def _source(msg: Message, live: LiveReply | None) -> str:
    """The Markdown a message shows: its text (with a cursor while it streams, unless its
    reasoning streams), the prefill's progress before the first token, or a note for an empty
    reply."""
    text = live.text if live else msg.content
    if live and live.status == "streaming":
        if not text and live.reasoning:
            return ""
        return prefill_note(*live.progress) if not text and live.progress else text + CURSOR
    called = bool(msg.extra.get("tool_calls"))
    return text or ("*(empty reply)*" if msg.role == "assistant" and not called else "")


def context_cut(view: View) -> int:
    """How many messages at the top of the shown path the latest reply's prompt left out
    (the marker goes on the first message it kept); 0 when it sent the whole path. A
    compacted branch's summary, at the top, is always sent (with the system prompt)."""
    lead = next((i for i, m in enumerate(view.path) if m.role != "system"), len(view.path))
    for msg in reversed(view.path):
        if msg.role == "assistant":
            n = int(msg.stats.get("context_dropped") or 0)
            return n + lead if 0 < n and n + lead < len(view.path) else 0
    return 0


def context_marker(n: int) -> str:
    return (f"✂ {n} earlier message{'s are' if n != 1 else ' is'} not in the model's context"
            " (still saved here)")


def prefill_note(done: int, total: int) -> str:
    """What a reply shows while its prompt is prefilled in chunks."""
    return f"*reading the conversation: {done:,} / {total:,} tokens…*"


def selection_label(view: View, index: int | None) -> str:
    """Markdown for the message toolbar: which message the buttons act on, counted among the
    messages shown (the active path), and which of its versions (siblings) it is."""
    if index is None or not 0 <= index < len(view.path):
        return "*No messages yet: type below.*"
    msg, (k, n) = view.path[index], view.siblings[index]
    who = "Your message" if msg.role == "user" else "Reply"
    versions = "versions of this reply" if msg.role == "assistant" else "versions of this message"
    branch = f" · branch **{k}/{n}** ({versions}: ‹ › switch)" if n > 1 else ""
    return f"{who} {index + 1} of {len(view.path)} messages shown{branch}"


def conversation_choices(convs: list[Conversation]) -> list[tuple[str, int]]:
    """Sidebar entries (Gradio shows labels as text, never HTML): ★ pinned, then archived."""
    return [(f"{'★ ' if c.pinned else ''}{c.title}  ·  {'archived · ' if c.archived else ''}"
             f"{_age(c.updated)}", c.id) for c in convs]


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
