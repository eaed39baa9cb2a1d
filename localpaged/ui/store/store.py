"""Conversation store of the chat app: one SQLite file (via sqlite-utils) holding the
conversations, their message trees, the active branch at each branch point, the sampling settings
each reply used and its generation stats. No UI and no engine here.

`Store` is assembled by concern, one module of this package each (see `__init__.py`); this one
holds the conversations: create, list/search, rename, update, delete.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .alternatives import TokenAlternatives, TokenChoice
from .app_settings import AppSettings
from .db import DB_FILENAME, guarded
from .errors import StoreError
from .export import EXPORT_FORMAT, ExportImport
from .fts import like_pattern
from .organise import Organise
from .rows import Conversation, Message, conversation_from_row
from .schema import CONTEXT_POLICIES, ROLES, STATS_KEYS, STATUSES
from .tool_servers import ToolServer, ToolServerRows

__all__ = ["Conversation", "Message", "Store", "StoreError", "default_data_dir", "ROLES",
           "STATUSES", "STATS_KEYS", "DB_FILENAME", "EXPORT_FORMAT", "ToolServer", "TokenChoice"]

# A conversation row with its tags (a JSON list, sorted).
_SELECT = ("SELECT c.*, (SELECT json_group_array(tag) FROM (SELECT tag FROM tags"
           " WHERE conversation_id = c.id ORDER BY tag)) AS tags FROM conversations c")
_CONVERSATION_FIELDS = ("title", "system_prompt", "model", "sampling", "options", "context_policy")


def default_data_dir() -> Path:
    """$LOCALPAGED_DATA_DIR, else the platform's per-user data dir + /localpaged."""
    if os.environ.get("LOCALPAGED_DATA_DIR"):
        return Path(os.environ["LOCALPAGED_DATA_DIR"]).expanduser()
    home = Path.home()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = home / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    return base / "localpaged"


class Store(AppSettings, ExportImport, Organise, ToolServerRows, TokenAlternatives):
    """The conversation store. `path` is the database file, or a directory to hold
    DB_FILENAME; missing directories are created (see StoreBase)."""

    @guarded
    def create_conversation(self, title: str = "New chat", system_prompt: str = "",
                            model: str | None = None,
                            sampling: dict[str, Any] | None = None) -> Conversation:
        with self._write():
            cid = self._insert_conversation(title, system_prompt, model, sampling)
        return self.get_conversation(cid)

    def _insert_conversation(self, title: str, system_prompt: str, model: str | None,
                             sampling: dict | None, created: float | None = None,
                             updated: float | None = None) -> int:
        now = time.time()
        return self.db.table("conversations").insert({
            "title": title, "created": now if created is None else created,
            "updated": now if updated is None else updated,
            "system_prompt": system_prompt, "model": model,
            "sampling": json.dumps(sampling or {})}).last_pk

    @guarded
    def get_conversation(self, conversation_id: int) -> Conversation:
        rows = self._rows(_SELECT + " WHERE c.id = ?", [conversation_id])
        if not rows:
            raise KeyError(f"no conversation {conversation_id}")
        return conversation_from_row(rows[0])

    @guarded
    def list_conversations(self, search: str | None = None, *, archived: bool | None = None,
                           tag: str | None = None) -> list[Conversation]:
        """Pinned first, then newest (most recently updated) first. `search` matches a
        substring of the title (case-insensitively for ASCII) or the words of any message of
        any branch (`fts.py`; a substring where this SQLite has no FTS5). `archived`: None
        lists every conversation, False the unarchived, True the archived; `tag`: only those
        with this tag."""
        where, params = [], {}
        if search:
            params["q"] = like_pattern(search)
            where.append("(c.title LIKE :q ESCAPE '\\' OR c.id IN (SELECT conversation_id"
                         f" FROM messages WHERE {self._content_match(search, params)}))")
        if archived is not None:
            where.append("c.archived = :archived")
            params["archived"] = int(archived)
        if tag is not None:
            where.append("c.id IN (SELECT conversation_id FROM tags WHERE tag = :tag)")
            params["tag"] = tag
        sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "")
        rows = self._rows(sql + " ORDER BY c.pinned DESC, c.updated DESC, c.id DESC", params)
        return [conversation_from_row(r) for r in rows]

    def rename_conversation(self, conversation_id: int, title: str) -> Conversation:
        return self.update_conversation(conversation_id, title=title)

    @guarded
    def update_conversation(self, conversation_id: int, **fields: Any) -> Conversation:
        """Fields: title, system_prompt, model, sampling, options (dicts, replacing the old),
        context_policy (one of CONTEXT_POLICIES)."""
        unknown = set(fields) - set(_CONVERSATION_FIELDS)
        if unknown:
            raise TypeError(f"update_conversation: unknown fields {sorted(unknown)}")
        if fields.get("context_policy", CONTEXT_POLICIES[0]) not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy must be one of {list(CONTEXT_POLICIES)}, "
                             f"got {fields['context_policy']!r}")
        self.get_conversation(conversation_id)
        if "sampling" in fields:
            fields["sampling"] = json.dumps(fields["sampling"] or {})
        if "options" in fields:
            fields["options"] = json.dumps(fields["options"] or {})
        with self._write():
            self.db.table("conversations").update(conversation_id,
                                                  {**fields, "updated": time.time()})
        return self.get_conversation(conversation_id)

    @guarded
    def delete_conversation(self, conversation_id: int) -> bool:
        """Delete it and all its messages; False if there was no such conversation."""
        with self._write():
            # Flatten the tree first: a deep chain of per-row cascades would hit SQLite's
            # trigger depth limit (1000).
            self.db.execute("UPDATE messages SET parent_id = NULL, active_child_id = NULL"
                            " WHERE conversation_id = ?", [conversation_id])
            deleted = self.db.execute("DELETE FROM conversations WHERE id = ?",
                                      [conversation_id]).rowcount > 0
            self._drop_unreferenced()        # its images, unless another message names them
            return deleted
