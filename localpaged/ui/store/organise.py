"""Organising conversations (part of `Store`): pin, archive, tags, and the full-text search of
every message of every branch that says where each hit is (`fts.py` keeps the index). Schema
version 5.

Tags: a tag is the user's text with its whitespace collapsed, 1 to MAX_TAG_CHARS characters,
compared exactly; a conversation holds at most MAX_TAGS, each once. Pinning and archiving
write the flag only: they do not bump `updated` (the list's order among the unpinned stays the
order of use).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .db import StoreBase, guarded
from .fts import (FTS_TABLE, HIT_END, HIT_START, SNIPPET_WORDS, fts_query, hit_parts,
                  like_pattern)

MAX_TAGS = 16
MAX_TAG_CHARS = 40
MAX_HITS = 50


def clean_tags(tags: Any) -> list[str]:
    """Tags as stored (sorted, each once) from a list of strings or one comma-separated string;
    ValueError naming the problem."""
    if isinstance(tags, str):
        tags = tags.split(",")
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        raise ValueError("tags must be a list of strings")
    out = sorted({" ".join(t.split()) for t in tags} - {""})
    long = [t for t in out if len(t) > MAX_TAG_CHARS]
    if long:
        raise ValueError(f"a tag has at most {MAX_TAG_CHARS} characters: {long[0][:60]!r}")
    if len(out) > MAX_TAGS:
        raise ValueError(f"a conversation has at most {MAX_TAGS} tags, not {len(out)}")
    return out


@dataclass
class Hit:
    """One message that matches a search: where it is and the words around the match
    (`snippet` holds HIT_START/HIT_END around each matched word: see `parts`)."""
    message_id: int
    conversation_id: int
    title: str
    role: str
    snippet: str
    archived: bool

    def parts(self) -> list[tuple[str, bool]]:
        """(text, matched) pieces of the snippet, as stored (escape them to show as HTML)."""
        return hit_parts(self.snippet)


class Organise(StoreBase):
    """Needs `get_conversation` (in `Store`) and `self.fts` (StoreBase._open)."""

    @guarded
    def set_pinned(self, conversation_id: int, pinned: bool):
        return self._set_flag(conversation_id, "pinned", pinned)

    @guarded
    def set_archived(self, conversation_id: int, archived: bool):
        return self._set_flag(conversation_id, "archived", archived)

    def _set_flag(self, cid: int, column: str, value: bool):
        self.get_conversation(cid)
        with self._write():
            self.db.execute(f"UPDATE conversations SET {column} = ? WHERE id = ?",
                            [int(bool(value)), cid])
        return self.get_conversation(cid)

    @guarded
    def set_tags(self, conversation_id: int, tags: Any):
        """Replace the conversation's tags (see `clean_tags`); returns the conversation."""
        tags = clean_tags(tags)
        self.get_conversation(conversation_id)
        with self._write():
            self._write_tags(conversation_id, tags)
        return self.get_conversation(conversation_id)

    def _write_tags(self, cid: int, tags: list[str]) -> None:
        self.db.execute("DELETE FROM tags WHERE conversation_id = ?", [cid])
        for tag in tags:
            self.db.execute("INSERT INTO tags (conversation_id, tag) VALUES (?, ?)", [cid, tag])

    @guarded
    def all_tags(self) -> list[str]:
        """Every tag in use, sorted."""
        return [r["tag"] for r in self._rows("SELECT DISTINCT tag FROM tags ORDER BY tag")]

    @guarded
    def search_messages(self, text: str, archived: bool | None = False,
                        limit: int = MAX_HITS) -> list[Hit]:
        """Messages of every branch matching `text` (best match first; a prepared reply the
        user has not opened is not one); `archived` as in `list_conversations`."""
        if not text.strip():
            return []
        params: dict[str, Any] = {"limit": limit, "a": HIT_START, "b": HIT_END}
        where = "m.prepared IS NOT 'unseen'"
        if archived is not None:
            where += " AND c.archived = :archived"
            params["archived"] = int(archived)
        if self.fts:
            params["m"] = fts_query(text)
            rows = self._rows(
                f"SELECT m.id, m.conversation_id, m.role, c.title, c.archived,"
                f" snippet({FTS_TABLE}, 0, :a, :b, '…', {SNIPPET_WORDS}) AS snippet"
                f" FROM {FTS_TABLE} JOIN messages m ON m.id = {FTS_TABLE}.rowid"
                f" JOIN conversations c ON c.id = m.conversation_id"
                f" WHERE {FTS_TABLE} MATCH :m AND {where} ORDER BY rank LIMIT :limit", params)
        else:
            params["q"] = like_pattern(text)
            rows = self._rows(
                "SELECT m.id, m.conversation_id, m.role, c.title, c.archived, m.content"
                " FROM messages m JOIN conversations c ON c.id = m.conversation_id"
                f" WHERE m.content LIKE :q ESCAPE '\\' AND {where}"
                " ORDER BY c.updated DESC, m.id LIMIT :limit", params)
            for r in rows:
                r["snippet"] = like_snippet(str(r["content"]), text)
        return [Hit(r["id"], r["conversation_id"], str(r["title"]), str(r["role"]),
                    str(r["snippet"] or ""), bool(r["archived"])) for r in rows]

    def _content_match(self, text: str, params: dict) -> str:
        """The WHERE clause on `messages` for a search of `text` (its parameters added)."""
        if self.fts:
            query = fts_query(text)
            if query is None:
                return "0"
            params["m"] = query
            return f"id IN (SELECT rowid FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH :m)"
        params["q"] = like_pattern(text)
        return "content LIKE :q ESCAPE '\\'"


def like_snippet(content: str, text: str, around: int = 60) -> str:
    """The fallback's snippet: `around` characters either side of the first match, marked."""
    at = content.lower().find(text.lower())
    if at < 0:
        return content[:2 * around]
    start, end = max(0, at - around), min(len(content), at + len(text) + around)
    return ("…" if start else "") + content[start:at] + HIT_START + content[at:at + len(text)] \
        + HIT_END + content[at + len(text):end] + ("…" if end < len(content) else "")

