"""Two processes writing one conversation store (SQLite file, WAL) at the same time.

The oracle is the plan each writer follows: after both exit, every message each one wrote is
there, once, with its parent, its last content and its stats, and the file passes SQLite's
integrity check. A writer that cannot get the lock within busy_timeout_ms gets a StoreError that
says so and that nothing was saved; after the other lets go, the retry saves exactly once.
"""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest
from helpers.store_writers import N, holder, writer

from localpaged.ui import store as store_module
from localpaged.ui.store import Store, StoreError

CTX = mp.get_context("spawn")   # no fork of a process holding torch threads or SQLite handles
UI_DIR = str(Path(store_module.__file__).parent)


def test_two_processes_write_one_conversation(tmp_path):
    db = str(tmp_path / "chat.db")
    with Store(db) as store:
        cid = store.create_conversation("shared").id
    start, errors = CTX.Barrier(2), CTX.Queue()
    procs = [CTX.Process(target=writer, args=(UI_DIR, db, name, cid, start, errors)) for name in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert errors.empty(), errors.get()

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
    with Store(db) as store:
        titles = sorted(c.title for c in store.list_conversations())
        assert titles == ["a's own", "b's own", "shared"]
        for name in "ab":
            chain = _chain(store, cid, name)
            assert [m.content for m in chain] == [f"{name}-{i}" for i in range(N)]
            assert [m.stats["generated_tokens"] for m in chain] == list(range(N))


def _chain(store: Store, cid: int, name: str):
    """The writer's messages from its root down, following each message's only child."""
    exported = store.export_json(cid)["messages"]
    by_parent: dict = {}
    for m in exported:
        by_parent.setdefault(m["parent_id"], []).append(m)
    roots = [m for m in by_parent.get(None, []) if m["content"] == f"{name} root"]
    assert len(roots) == 1
    out, node = [], roots[0]
    while by_parent.get(node["id"]):
        (node,) = by_parent[node["id"]]
        out.append(store.get_message(node["id"]))
    return out


def test_lock_held_by_another_process_is_a_clear_error(tmp_path):
    db = str(tmp_path / "chat.db")
    store = Store(db, busy_timeout_ms=200)
    cid = store.create_conversation("t").id
    locked, release = CTX.Event(), CTX.Event()
    proc = CTX.Process(target=holder, args=(db, locked, release))
    proc.start()
    try:
        assert locked.wait(60), "the other process did not take the lock"
        with pytest.raises(StoreError, match=r"database is locked: .*200 ms; the change was NOT saved"):
            store.add_message(cid, None, "user", "hello")
    finally:
        release.set()
        proc.join(60)
    assert proc.exitcode == 0
    store.add_message(cid, None, "user", "hello")                  # the retry
    assert [m.content for m in store.active_path(cid)] == ["hello"]
    store.close()
