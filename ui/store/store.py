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

from .app_settings import AppSettings
from .db import DB_FILENAME, guarded
from .errors import StoreError
from .export import EXPORT_FORMAT, ExportImport
from .rows import Conversation, Message, conversation_from_row
from .schema import CONTEXT_POLICIES, ROLES, STATS_KEYS, STATUSES

__all__ = ["Conversation", "Message", "Store", "StoreError", "default_data_dir", "ROLES",
           "STATUSES", "STATS_KEYS", "DB_FILENAME", "EXPORT_FORMAT"]

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


class Store(AppSettings, ExportImport):
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
        return conversation_from_row(self._row("conversations", conversation_id, "conversation"))

    @guarded
    def list_conversations(self, search: str | None = None) -> list[Conversation]:
        """Newest (most recently updated) first; `search` matches, case-insensitively for
        ASCII, a substring of the title or of any message in the conversation."""
        sql, params = "SELECT * FROM conversations", {}
        if search:
            like = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += (" WHERE title LIKE :q ESCAPE '\\' OR id IN (SELECT conversation_id"
                    " FROM messages WHERE content LIKE :q ESCAPE '\\')")
            params = {"q": like}
        rows = self._rows(sql + " ORDER BY updated DESC, id DESC", params)
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
            return self.db.execute("DELETE FROM conversations WHERE id = ?",
                                   [conversation_id]).rowcount > 0
