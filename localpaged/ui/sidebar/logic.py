"""The sidebar's part of the controller, in plain Python: the conversation list a query asks for
(pinned first; archived ones only when asked; one tag), full-text search hits over every branch
and opening a hit on its branch, pin, archive, tags, and importing a JSON export from a file.

The list's query travels as a plain dict (`ListQuery.of` reads it, or a bare search string):
the page keeps it in a gr.State that the sidebar's search box, "show archived" box and tag filter
write, and that the tab set's listing hands to `ChatController.search`.

Import: the file is untrusted. It is read only up to MAX_IMPORT_BYTES, decoded as UTF-8, parsed
as strict JSON (no NaN/Infinity) and checked whole by the store (`store/validate.py`) before
anything is written; it only ever adds one new conversation, in one transaction, and never
changes an existing one. A bad file raises ImportFailed (or the store's ValueError naming the
field) with a sentence saying what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..store import Conversation, Store
from ..store.organise import Hit

MAX_IMPORT_BYTES = 256 * 1024 * 1024


class ImportFailed(ValueError):
    """A file that cannot be imported; the message says why (nothing was written)."""


@dataclass
class ListQuery:
    text: str = ""
    archived: bool = False            # show archived conversations too
    tag: str | None = None            # only conversations with this tag

    @classmethod
    def of(cls, value: Any) -> "ListQuery":
        """From the page's dict, a bare search string, or None (anything else: no filter)."""
        if isinstance(value, ListQuery):
            return value
        if isinstance(value, str):
            return cls(value.strip())
        if not isinstance(value, dict):
            return cls()
        text, tag = value.get("text"), value.get("tag")
        return cls(text.strip() if isinstance(text, str) else "", value.get("archived") is True,
                   tag if isinstance(tag, str) and tag else None)

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "archived": self.archived, "tag": self.tag}


class Organiser:
    def __init__(self, store: Store) -> None:
        self.store = store

    def listing(self, query: Any = "") -> list[Conversation]:
        q = ListQuery.of(query)
        return self.store.list_conversations(q.text or None, archived=None if q.archived else False,
                                             tag=q.tag)

    def hits(self, query: Any) -> list[Hit]:
        q = ListQuery.of(query)
        hits = self.store.search_messages(q.text, archived=None if q.archived else False)
        if q.tag is not None:
            tagged = {c.id for c in self.store.list_conversations(tag=q.tag)}
            hits = [h for h in hits if h.conversation_id in tagged]
        return hits

    def open_hit(self, message_id: int) -> int:
        """Make the hit's branch the shown one (the message and its ancestors active); returns
        its conversation id. KeyError when the message is gone."""
        return self.store.set_active(message_id)[0].conversation_id

    def toggle_pinned(self, cid: int) -> Conversation:
        return self.store.set_pinned(cid, not self.store.get_conversation(cid).pinned)

    def toggle_archived(self, cid: int) -> Conversation:
        return self.store.set_archived(cid, not self.store.get_conversation(cid).archived)

    def set_tags(self, cid: int, tags: str) -> Conversation:
        return self.store.set_tags(cid, tags)

    def tags(self) -> list[str]:
        return self.store.all_tags()

    def import_file(self, path: str | Path) -> Conversation:
        """A new conversation from the JSON export in the file (see the module docstring)."""
        return self.store.import_json(read_export(path))


def read_export(path: str | Path) -> Any:
    """The JSON value in the file; ImportFailed saying why it is not one."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_IMPORT_BYTES + 1)
    except OSError as e:
        raise ImportFailed(f"could not read the file: {e.strerror or e}") from e
    if len(raw) > MAX_IMPORT_BYTES:
        raise ImportFailed(f"the file is larger than {MAX_IMPORT_BYTES // 2**20} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ImportFailed(f"the file is not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ImportFailed(f"the file is not JSON: {e.msg} at line {e.lineno}, "
                           f"column {e.colno}") from None
    except RecursionError:
        raise ImportFailed("the file's JSON is nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise ImportFailed(f"the file is not strict JSON: {name} is not a number")
