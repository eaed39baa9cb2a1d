"""Store files as an older schema version left them, for the migration tests: the version 1
tables (V1_SCHEMA) brought up by the migrations that existed then; and the tree invariant every
store test checks (check_active_invariant)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from localpaged.ui.store import Store
from localpaged.ui.store.schema import MIGRATIONS


V1_SCHEMA = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL,
    updated REAL NOT NULL, system_prompt TEXT NOT NULL DEFAULT '', model TEXT,
    sampling TEXT NOT NULL DEFAULT '{}',
    active_root_id INTEGER REFERENCES messages(id) ON DELETE SET NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')), content TEXT NOT NULL,
    created REAL NOT NULL, sampling TEXT,
    active_child_id INTEGER REFERENCES messages(id) ON DELETE SET NULL);
CREATE INDEX messages_conversation ON messages(conversation_id);
CREATE INDEX messages_parent ON messages(parent_id);
INSERT INTO conversations VALUES (1, 'old chat', 1.0, 2.0, '', 'm', '{}', 1);
INSERT INTO messages VALUES (1, 1, NULL, 'user', 'hi', 1.0, NULL, 2);
INSERT INTO messages VALUES (2, 1, 1, 'assistant', 'hello', 2.0, '{"temperature": 0}', NULL);
PRAGMA user_version = 1;
"""


def v1_store(tmp_path) -> Path:
    """A store file as version 1 of the schema wrote it (see V1_SCHEMA)."""
    old = tmp_path / "v1.db"
    conn = sqlite3.connect(old)
    conn.executescript(V1_SCHEMA)
    conn.close()
    return old


def ids(messages):
    return [m.id for m in messages]


def check_active_invariant(store: Store, cid: int) -> None:
    """Every message with children has exactly one active child, one of its children; every
    conversation with roots has an active root, one of its roots."""
    roots = store.children(None, cid)
    assert (store.get_conversation(cid).active_root_id in ids(roots)) if roots else True
    for m in store.export_json(cid)["messages"]:
        kids = store.children(m["id"])
        assert (m["active_child_id"] in ids(kids)) if kids else m["active_child_id"] is None


def old_store(path: Path, version: int, rows: bool = False) -> sqlite3.Connection:
    """An open connection to a new file at schema `version` (empty, or with V1_SCHEMA's rows
    when `rows`); the caller adds what it needs, commits and closes it."""
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    if not rows:
        conn.execute("DELETE FROM messages")
        conn.execute("DELETE FROM conversations")
    for v in range(1, version):
        for sql in MIGRATIONS[v]:
            conn.execute(sql)
    conn.execute(f"PRAGMA user_version = {int(version)}")
    return conn
