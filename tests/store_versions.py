"""Store files as an older schema version left them, for the migration tests: the version 1
tables (test_store.V1_SCHEMA) brought up by the migrations that existed then."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from test_store import V1_SCHEMA

from localpaged.ui.store.schema import MIGRATIONS


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
