"""How a stored message becomes a chat message for the engine, with what `Message.extra` holds:
a user message's attachments (their text after the message, each in a fenced block named by its
file) and images (image parts before its text: ui/images/logic.py), an assistant message's `tool_calls` (OpenAI's shape, which chat templates take) and a
tool message's `tool_call_id`. The rendered text is a pure function of the stored message, so a
later turn's prompt repeats an earlier one token for token and the prefix cache serves it.

Also: attachments read from files (text, code, PDF through pypdf; images through Pillow:
store/images.py), checked and capped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..images.logic import ImageSource, image_parts
from ..store import Message
from ..store.images import looks_like_image, read_image

MAX_ATTACHMENT_CHARS = 1_000_000      # one file's text
MAX_ATTACHMENT_BYTES = 20_000_000     # one file on disk (a PDF's text is far smaller)
MAX_ATTACHMENTS = 10


def message_dict(m: Message, images: ImageSource | None = None) -> dict[str, Any]:
    """The engine's chat message for a stored one; a user message's images take their
    pixels from `images` (chat/images.py)."""
    if m.role == "tool":
        return {"role": "tool", "content": m.content,
                "tool_call_id": str(m.extra.get("tool_call_id", "")),
                "name": str(m.extra.get("name", ""))}
    if m.role == "assistant" and m.extra.get("tool_calls"):
        calls = [{"id": str(c.get("id", "")), "type": "function",
                  "function": {"name": str(c.get("name", "")),
                               "arguments": str(c.get("arguments", "{}"))}}
                 for c in m.extra["tool_calls"] if isinstance(c, dict)]
        return {"role": "assistant", "content": m.content, "tool_calls": calls}
    text = m.content
    if m.role == "user" and m.extra.get("attachments"):
        text = with_attachments(m.content, m.extra["attachments"])
    parts = image_parts(m.extra, images) if m.role == "user" else []
    if parts:
        return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}
    return {"role": m.role, "content": text}


def with_attachments(text: str, attachments: list) -> str:
    """A user message's text followed by its attachments' text."""
    blocks = [text] if text else []
    for att in attachments:
        if isinstance(att, dict):
            body = str(att.get("text", ""))
            fence = "`" * max(3, _longest_backtick_run(body) + 1)     # the file cannot close it
            blocks.append(f"Attached file {att.get('name', 'file')}:\n{fence}\n{body}\n{fence}")
    return "\n\n".join(blocks)


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def read_attachment(path: str | Path, name: str | None = None) -> dict[str, Any]:
    """{"name", "kind", "text"} of a text, code or PDF file, {"name", "kind": "image",
    "image": ImageFile} of an image (by its suffix or first bytes); ValueError naming the file
    and what is wrong (too large, not text, a PDF without text, a bad image) so nothing is
    silently cut."""
    path = Path(path)
    name = name or path.name
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(16)
    if looks_like_image(name, head):
        if size > MAX_ATTACHMENT_BYTES:
            raise ValueError(f"{name} is {size:,} bytes; at most {MAX_ATTACHMENT_BYTES:,} can "
                             "be attached")
        return {"name": name[:200], "kind": "image", "image": read_image(path.read_bytes(), name)}
    if size > MAX_ATTACHMENT_BYTES:
        raise ValueError(f"{name} is {size:,} bytes; at most {MAX_ATTACHMENT_BYTES:,} can be "
                         "attached")
    if path.suffix.lower() == ".pdf":
        text, kind = _pdf_text(path, name), "pdf"
    else:
        raw = path.read_bytes()
        if b"\x00" in raw[:8192]:
            raise ValueError(f"{name} is not a text file (text, code or PDF can be attached)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{name} is not UTF-8 text (text, code or PDF can be attached)") \
                from None
        kind = "text"
    if len(text) > MAX_ATTACHMENT_CHARS:
        raise ValueError(f"{name} holds {len(text):,} characters of text; at most "
                         f"{MAX_ATTACHMENT_CHARS:,} can be attached")
    return {"name": name[:200], "kind": kind, "text": text}


def _pdf_text(path: Path, name: str) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError
    try:
        reader = PdfReader(str(path))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, OSError) as exc:
        raise ValueError(f"{name} could not be read as a PDF: {exc}") from None
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise ValueError(f"{name} has no text to extract (a scanned PDF?)")
    return text
