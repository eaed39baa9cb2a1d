"""Child-process bodies for tests/store/test_store_two_processes.py (spawned by multiprocessing).

They load ui/ as a bare package: importing localpaged/__init__ (torch) would take seconds in
each child, and only the store is under test.
"""

from __future__ import annotations

import importlib
import sqlite3
import sys
import types

N = 40          # messages per writer


def _store_class(ui_dir: str):
    pkg = types.ModuleType("_ui")
    pkg.__path__ = [ui_dir]
    sys.modules.setdefault("_ui", pkg)
    return importlib.import_module("_ui.store").Store


def writer(ui_dir: str, db: str, name: str, conversation_id: int, start, errors) -> None:
    """Append a chain of N messages under one new user message, updating each after adding it."""
    try:
        store = _store_class(ui_dir)(db, busy_timeout_ms=30_000)
        start.wait(60)
        parent = store.add_message(conversation_id, None, "user", f"{name} root").id
        for i in range(N):
            mid = store.add_message(conversation_id, parent, "assistant" if i % 2 == 0 else "user",
                                    f"{name}-{i} draft").id
            store.update_message(mid, content=f"{name}-{i}", stats={"generated_tokens": i})
            parent = mid
        store.create_conversation(f"{name}'s own")
        store.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the test
        errors.put(f"{name}: {type(e).__name__}: {e}")


def holder(db: str, locked, release) -> None:
    """Hold an exclusive lock on the file until told to let go."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    locked.set()
    release.wait(60)
    conn.execute("COMMIT")
    conn.close()
