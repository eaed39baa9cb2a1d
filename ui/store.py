"""Conversation store of the chat app: one SQLite file (via sqlite-utils) holding the
conversations, their message trees, the active branch at each branch point, the sampling settings
each reply used and its generation stats. No UI and no engine here; the schema, its migrations,
the row dataclasses and the tree queries live in `store_schema.py`.

Tree: a message's parent is in the same conversation; regenerate adds a sibling assistant reply,
editing a user message adds a sibling user message. The path shown is the active path: from the
conversation's active root, follow each message's active child (see `store_schema`).

Durability: every write method is one transaction, committed before it returns (a streaming
reply is written with status 'streaming' and re-written as it grows, then 'complete' or
'stopped'); WAL mode; `mark_interrupted()` at start-up turns replies a crash left 'streaming'
into 'interrupted', keeping their text. Nothing fails silently: a busy or damaged file raises
StoreError naming the file, and the write it interrupted is rolled back, not half done.

Threads: Gradio calls from worker threads, so the store holds one `sqlite3` connection opened
with `check_same_thread=False` (wrapped by `sqlite_utils.Database`) and an RLock taken by every
public method. Chosen over a connection per thread: worker threads come and go (per-thread
connections would leak), SQLite serializes writers anyway, and the lock keeps one thread's
statements out of another thread's open transaction on the shared connection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from sqlite_utils import Database

from .store_schema import (ACTIVE_PATH_SQL, PATH_TO_SQL, ROLES, SCHEMA_VERSION, STATS_KEYS,
                           STATUSES, SUBTREE_SQL, Conversation, Message, StoreError,
                           conversation_from_row, message_from_row, migrate, parents_first)

__all__ = ["Conversation", "Message", "Store", "StoreError", "default_data_dir", "ROLES",
           "STATUSES", "STATS_KEYS", "DB_FILENAME"]

log = logging.getLogger(__name__)

DB_FILENAME = "conversations.db"
EXPORT_FORMAT = "localpaged.conversation"
_CONVERSATION_FIELDS = ("title", "system_prompt", "model", "sampling")


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


def _guarded(method):
    """Run a public method under the store's lock; SQLite errors become StoreError (busy or
    damaged file) or ValueError (a constraint the arguments broke)."""
    @functools.wraps(method)
    def wrapper(self: "Store", *args, **kwargs):
        with self._lock:
            try:
                return method(self, *args, **kwargs)
            except sqlite3.IntegrityError as e:
                raise ValueError(f"{method.__name__}: {e}") from e
            except sqlite3.DatabaseError as e:
                raise self._store_error(e) from e
    return wrapper


class Store:
    """The conversation store. `path` is the database file, or a directory to hold
    DB_FILENAME; missing directories are created."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 5000):
        path = Path(path).expanduser().absolute()
        self.path = path / DB_FILENAME if path.is_dir() else path
        self.busy_timeout_ms = busy_timeout_ms
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the data dir {self.path.parent}: {e}") from e
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False,
                                   timeout=busy_timeout_ms / 1000)
        except sqlite3.Error as e:
            raise self._store_error(e) from e
        try:
            self.db = Database(conn)
            self._open()
        except BaseException as e:
            conn.close()
            if isinstance(e, sqlite3.DatabaseError):
                raise self._store_error(e) from e
            raise

    def _open(self) -> None:
        self.db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        self.db.execute("PRAGMA foreign_keys = ON")
        problems = [row[0] for row in self.db.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise StoreError(f"{self.path} is damaged (PRAGMA quick_check: "
                             f"{'; '.join(problems[:5])}): {self._advice()}")
        self.db.enable_wal()
        migrate(self.db, self.path)

    def _advice(self) -> str:
        return (f"move {self.path} aside (a new empty store is then created) "
                "or restore it from a backup")

    def _store_error(self, e: sqlite3.Error) -> StoreError:
        text = str(e)
        if "locked" in text or "busy" in text:
            return StoreError(
                f"database is locked: {self.path} was held by another writer for longer than "
                f"{self.busy_timeout_ms} ms; the change was NOT saved. Close the other program "
                "(another localpaged?) using this file, then retry")
        if "closed" in text:
            return StoreError(f"the store on {self.path} is closed")
        return StoreError(f"{self.path} cannot be used ({text}): {self._advice()}")

    def close(self) -> None:
        with self._lock:
            self.db.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """One transaction, committed on exit (never nested: helpers called inside it do not
        open their own). BEGIN IMMEDIATE (not sqlite-utils' deferred BEGIN) takes the write
        lock first, so a busy file fails before anything is written."""
        self.db.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.conn.rollback()
            raise
        self.db.conn.commit()

    def _rows(self, sql: str, params: Any = ()) -> list[dict]:
        return list(self.db.query(sql, params))

    def _touch(self, conversation_id: int) -> None:
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?",
                        [time.time(), conversation_id])

    # -- conversations --------------------------------------------------------------------

    @_guarded
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

    @_guarded
    def get_conversation(self, conversation_id: int) -> Conversation:
        rows = self._rows("SELECT * FROM conversations WHERE id = ?", [conversation_id])
        if not rows:
            raise KeyError(f"no conversation {conversation_id}")
        return conversation_from_row(rows[0])

    @_guarded
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

    @_guarded
    def update_conversation(self, conversation_id: int, **fields: Any) -> Conversation:
        """Fields: title, system_prompt, model, sampling (dict, replaces the old one)."""
        unknown = set(fields) - set(_CONVERSATION_FIELDS)
        if unknown:
            raise TypeError(f"update_conversation: unknown fields {sorted(unknown)}")
        self.get_conversation(conversation_id)
        if "sampling" in fields:
            fields["sampling"] = json.dumps(fields["sampling"] or {})
        with self._write():
            self.db.table("conversations").update(conversation_id,
                                                  {**fields, "updated": time.time()})
        return self.get_conversation(conversation_id)

    @_guarded
    def delete_conversation(self, conversation_id: int) -> bool:
        """Delete it and all its messages; False if there was no such conversation."""
        with self._write():
            # Flatten the tree first: a deep chain of per-row cascades would hit SQLite's
            # trigger depth limit (1000).
            self.db.execute("UPDATE messages SET parent_id = NULL, active_child_id = NULL"
                            " WHERE conversation_id = ?", [conversation_id])
            return self.db.execute("DELETE FROM conversations WHERE id = ?",
                                   [conversation_id]).rowcount > 0

    # -- messages ---------------------------------------------------------------------------

    @_guarded
    def get_message(self, message_id: int) -> Message:
        rows = self._rows("SELECT * FROM messages WHERE id = ?", [message_id])
        if not rows:
            raise KeyError(f"no message {message_id}")
        return message_from_row(rows[0])

    @_guarded
    def add_message(self, conversation_id: int, parent_id: int | None, role: str, content: str,
                    sampling: dict[str, Any] | None = None, status: str = "complete",
                    stats: dict[str, Any] | None = None) -> Message:
        """Add a child of `parent_id` (None: a new root) and make it the active child."""
        self._check(role=role, status=status)
        self.get_conversation(conversation_id)
        # Invariant: a message's parent is in the same conversation.
        if parent_id is not None and self.get_message(parent_id).conversation_id != conversation_id:
            raise ValueError(f"message {parent_id} is not in conversation {conversation_id}")
        with self._write():
            mid = self._insert(conversation_id, parent_id, role, content, sampling, status,
                               stats or {}, time.time())
            self._touch(conversation_id)
        return self.get_message(mid)

    def _check(self, role: str | None = None, status: str | None = None) -> None:
        if role is not None and role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")

    def _insert(self, cid: int, parent_id: int | None, role: str, content: str,
                sampling: dict | None, status: str, stats: dict, created: float) -> int:
        mid = self.db.table("messages").insert({
            "conversation_id": cid, "parent_id": parent_id, "role": role, "content": content,
            "created": created, "status": status, "stats": json.dumps(stats),
            "sampling": None if sampling is None else json.dumps(sampling)}).last_pk
        self._activate(cid, parent_id, mid)
        return mid

    def _activate(self, cid: int, parent_id: int | None, mid: int) -> None:
        if parent_id is None:
            self.db.execute("UPDATE conversations SET active_root_id = ? WHERE id = ?", [mid, cid])
        else:
            self.db.execute("UPDATE messages SET active_child_id = ? WHERE id = ?",
                            [mid, parent_id])

    @_guarded
    def update_message(self, message_id: int, *, content: str | None = None,
                       status: str | None = None,
                       stats: dict[str, Any] | None = None) -> Message:
        """Rewrite a message (a streaming reply as it grows); `stats` is merged into the old
        stats. Committed before returning."""
        self._check(status=status)
        old = self.get_message(message_id)
        new = {"content": content, "status": status,
               "stats": None if stats is None else json.dumps({**old.stats, **stats})}
        new = {k: v for k, v in new.items() if v is not None}
        with self._write():
            if new:
                self.db.table("messages").update(message_id, new)
            self._touch(old.conversation_id)
        return self.get_message(message_id)

    @_guarded
    def delete_message(self, message_id: int) -> None:
        """Delete a message and its subtree; the parent's newest remaining child (or the newest
        remaining root) becomes active if the deleted one was."""
        m = self.get_message(message_id)
        ids = json.dumps([r["id"] for r in self._rows(SUBTREE_SQL, [message_id])])
        with self._write():
            # Flatten the subtree before deleting it (see delete_conversation).
            self.db.execute("UPDATE messages SET parent_id = NULL, active_child_id = NULL"
                            " WHERE id IN (SELECT value FROM json_each(?))", [ids])
            self.db.execute("DELETE FROM messages WHERE id IN (SELECT value FROM json_each(?))",
                            [ids])
            rest = self._children(m.conversation_id, m.parent_id)
            if rest and self._active_of(m.conversation_id, m.parent_id) is None:
                self._activate(m.conversation_id, m.parent_id, rest[-1].id)
            self._touch(m.conversation_id)

    def _children(self, cid: int, parent_id: int | None) -> list[Message]:
        if parent_id is None:
            where, arg = "parent_id IS NULL AND conversation_id = ?", cid
        else:
            where, arg = "parent_id = ?", parent_id
        rows = self._rows(f"SELECT * FROM messages WHERE {where} ORDER BY id", [arg])
        return [message_from_row(r) for r in rows]

    def _active_of(self, cid: int, parent_id: int | None) -> int | None:
        if parent_id is None:
            return self.get_conversation(cid).active_root_id
        return self.get_message(parent_id).active_child_id

    @_guarded
    def children(self, message_id: int | None,
                 conversation_id: int | None = None) -> list[Message]:
        """Children of `message_id` in creation order; with message_id=None, the roots of
        `conversation_id` (then required)."""
        if message_id is None and conversation_id is None:
            raise TypeError("children(None) needs conversation_id")
        if message_id is not None:
            conversation_id = self.get_message(message_id).conversation_id
        return self._children(conversation_id, message_id)

    @_guarded
    def siblings(self, message_id: int) -> tuple[list[int], int]:
        """(ids of the message and its siblings in creation order, index of the message), for
        the `‹ 2/3 ›` control (index is 0-based)."""
        m = self.get_message(message_id)
        ids = [c.id for c in self._children(m.conversation_id, m.parent_id)]
        return ids, ids.index(message_id)

    @_guarded
    def set_active(self, message_id: int) -> list[Message]:
        """Switch branch: make the message, and every ancestor, the active child of its parent.
        Returns the new active path (it passes through the message, then follows the active
        children below it)."""
        path = self.path_to(message_id)
        with self._write():
            for m in path:
                self._activate(m.conversation_id, m.parent_id, m.id)
        return self.active_path(path[0].conversation_id)

    @_guarded
    def active_path(self, conversation_id: int) -> list[Message]:
        """Messages from the active root down the active children to a leaf ([] if empty)."""
        return [message_from_row(r) for r in self._rows(ACTIVE_PATH_SQL, [conversation_id])]

    @_guarded
    def path_to(self, message_id: int) -> list[Message]:
        """Messages from the root down to `message_id` (inclusive)."""
        rows = self._rows(PATH_TO_SQL, [message_id])
        if not rows:
            raise KeyError(f"no message {message_id}")
        return [message_from_row(r) for r in rows]

    @_guarded
    def mark_interrupted(self) -> int:
        """At start-up: replies left 'streaming' by a crashed writer become 'interrupted'
        (text kept). Returns how many. Do not call while this file has a live writer."""
        with self._write():
            n = self.db.execute("UPDATE messages SET status = 'interrupted'"
                                " WHERE status = 'streaming'").rowcount
        if n:
            log.warning("%s: %d reply(ies) cut off by a crash marked 'interrupted'", self.path, n)
        return n

    # -- fork, export, import --------------------------------------------------------------

    @_guarded
    def fork_conversation(self, message_id: int, title: str | None = None) -> Conversation:
        """A new conversation with the same settings holding a copy of the path up to
        `message_id` (timestamps, sampling, stats and status copied)."""
        path = self.path_to(message_id)
        src = self.get_conversation(path[0].conversation_id)
        with self._write():
            cid = self._insert_conversation(title or f"{src.title} (fork)", src.system_prompt,
                                            src.model, src.sampling)
            parent = None
            for m in path:
                parent = self._insert(cid, parent, m.role, m.content, m.sampling, m.status,
                                      m.stats, m.created)
        return self.get_conversation(cid)

    @_guarded
    def export_json(self, conversation_id: int) -> dict[str, Any]:
        """The whole tree: {"format", "schema_version", "conversation": {...}, "messages":
        [{...}, ...]} with messages in creation order (parents before children); ids are this
        store's, used only to link messages inside the export."""
        conv = dataclasses.asdict(self.get_conversation(conversation_id))
        msgs = self._rows("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                          [conversation_id])
        return {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "conversation": conv,
                "messages": [dataclasses.asdict(message_from_row(r)) for r in msgs]}

    @_guarded
    def import_json(self, data: dict[str, Any]) -> Conversation:
        """A new conversation from an export_json() dict (new ids; active branches kept)."""
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            raise ValueError(f"import_json: not a {EXPORT_FORMAT} export")
        c, msgs = data["conversation"], parents_first(data.get("messages", []))
        for m in msgs:
            self._check(role=m["role"], status=m.get("status", "complete"))
        now = time.time()
        with self._write():
            cid = self._insert_conversation(
                c.get("title", "Imported chat"), c.get("system_prompt", ""), c.get("model"),
                c.get("sampling"), c.get("created"), c.get("updated"))
            ids: dict[Any, int] = {}
            for m in msgs:
                ids[m["id"]] = self._insert(cid, ids.get(m.get("parent_id")), m["role"],
                                            m["content"], m.get("sampling"),
                                            m.get("status", "complete"), m.get("stats") or {},
                                            m.get("created", now))
            self._restore_active(cid, c, msgs, ids)
        return self.get_conversation(cid)

    def _restore_active(self, cid: int, c: dict, msgs: list[dict], ids: dict) -> None:
        # _insert left the last-inserted child active; the export's choice wins where it names
        # a child of that parent (a root for active_root_id).
        parent_of = {m["id"]: m.get("parent_id") for m in msgs}
        root = c.get("active_root_id")
        if root in ids and parent_of[root] is None:
            self._activate(cid, None, ids[root])
        for m in msgs:
            child = m.get("active_child_id")
            if child in ids and parent_of[child] == m["id"]:
                self._activate(cid, ids[m["id"]], ids[child])

    @_guarded
    def export_markdown(self, conversation_id: int) -> str:
        """The active path as Markdown: title, model, system prompt, then one section per
        message; a reply that did not complete is marked with its status."""
        conv = self.get_conversation(conversation_id)
        parts = [f"# {conv.title}\n"]
        if conv.model:
            parts.append(f"*Model: {conv.model}*\n")
        if conv.system_prompt:
            parts.append(f"### System\n\n{conv.system_prompt}\n")
        for m in self.active_path(conversation_id):
            note = "" if m.status == "complete" else f"\n\n*(reply {m.status})*"
            parts.append(f"### {m.role.capitalize()}\n\n{m.content}{note}\n")
        return "\n".join(parts)
