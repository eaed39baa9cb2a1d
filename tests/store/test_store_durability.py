"""A reply's final write lands however long the file is busy (ui/store/retry.py, ui/turns.py);
errors name their cause: disk full, read-only, locked, damaged (ui/store/errors.py); the data
directory and database are the user's alone (ui/store/private.py)."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import stat
import time
from pathlib import Path

import pytest
from sqlite_utils import Database

from localpaged.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from localpaged.ui.store import Store, StoreError
from localpaged.ui.store.errors import cause_of
from localpaged.ui.store.retry import until_saved
from localpaged.ui.live_reply import LiveReply
from localpaged.ui.turns import Turn


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chat.db")
    yield s
    s.close()


def mode(path) -> int:
    return stat.S_IMODE(Path(path).stat().st_mode)


def stream(words: list[str]):
    """What the engine yields for a reply of these words, one token each, the last finished."""
    start = time.time()
    for n in range(1, len(words) + 1):
        done = n == len(words)
        yield RequestOutput(
            "r1", None, [1, 2, 3],
            [CompletionOutput(0, " ".join(words[:n]), list(range(100, 100 + n)),
                              "stop" if done else None)],
            done, RequestMetrics(start, start + 0.01, start + 0.02 * n if done else None, 2, n))


# -- the final write of a reply ------------------------------------------------------------

def test_a_reply_ending_while_the_file_is_locked_is_saved_once_it_is_free(store):
    c = store.create_conversation("t")
    user = store.add_message(c.id, None, "user", "count")
    reply = store.add_message(c.id, user.id, "assistant", "", status="streaming")
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")          # another program holds the write lock for 6 s
    held = time.monotonic()
    words = [str(i) for i in range(12)]
    turn = Turn(c.id, "r1", [LiveReply(reply.id)], stream(words), lambda _rid: None,
                store).start()
    try:
        assert not turn.wait(2.0)              # the reply ended, its save is retrying
        live = turn.replies[0]
        assert (live.text, live.status) == (" ".join(words), "complete")   # kept in memory
        start = time.monotonic()               # other tabs still read the store meanwhile
        for _ in range(5):
            assert [m.id for m in store.active_path(c.id)] == [user.id, reply.id]
            assert store.list_conversations()[0].id == c.id
        assert time.monotonic() - start < 1.5
        time.sleep(max(0.0, 6.0 - (time.monotonic() - held)))
        assert not turn.done
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert turn.wait(10)
    saved = store.get_message(reply.id)
    assert (saved.content, saved.status) == (" ".join(words), "complete")
    assert saved.stats["generated_tokens"] == 12 and saved.stats["finish_reason"] == "stop"
    assert saved.stats["prompt_tokens"] == 3 and saved.stats["prefix_tokens_reused"] == 2
    assert saved.token_ids == list(range(100, 112))
    assert turn.error is None


def test_until_saved_backs_off_on_a_full_disk_and_stops_on_a_closed_store(store, monkeypatch):
    c = store.create_conversation("t")
    m = store.add_message(c.id, None, "user", "draft")
    real, fails, sleeps = store._write, [3], []

    def flaky_write():                         # the disk is full for the first three tries
        if fails[0]:
            fails[0] -= 1
            raise sqlite3.OperationalError("database or disk is full")
        return real()
    monkeypatch.setattr(store, "_write", flaky_write)
    assert until_saved(store, lambda: store.update_message(m.id, content="final"), "m",
                       sleep=sleeps.append)
    assert store.get_message(m.id).content == "final" and sleeps == [0.1, 0.2, 0.5]
    assert store.db.execute("PRAGMA busy_timeout").fetchone()[0] == store.busy_timeout_ms
    assert until_saved(store, lambda: store.update_message(10**6, content="x"), "gone") is False
    store.close()
    with pytest.raises(StoreError) as e:
        until_saved(store, lambda: store.update_message(m.id, content="x"), "m")
    assert e.value.cause == "closed"


# -- errors name their cause ---------------------------------------------------------------

def assert_says(error: StoreError, cause: str, *words: str) -> None:
    text = str(error)
    assert error.cause == cause, text
    assert all(w in text for w in words), text
    assert "aside" not in text and "move" not in text, text


def test_disk_full(store):
    c = store.create_conversation("t")
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages + 2}")     # a real SQLITE_FULL
    with pytest.raises(StoreError) as e:
        store.add_message(c.id, None, "user", "x" * 100_000)
    assert_says(e.value, "full", "disk holding", "is full", "NOT saved", str(store.path))
    assert store.active_path(c.id) == []                        # rolled back


def test_disk_full_as_raised_without_a_code(store, monkeypatch):
    c = store.create_conversation("t")

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(store, "_insert", full)
    with pytest.raises(StoreError) as e:
        store.add_message(c.id, None, "user", "hi")
    assert_says(e.value, "full", "is full")
    assert cause_of(OSError(errno.ENOSPC, "No space left on device")) == "full"


def test_read_only_database(store):
    c = store.create_conversation("t")
    ro = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True, check_same_thread=False)
    store.db.conn.close()
    store.db = Database(ro)
    assert [x.id for x in store.list_conversations()] == [c.id]    # reading works
    with pytest.raises(StoreError) as e:
        store.add_message(c.id, None, "user", "hi")
    assert_says(e.value, "readonly", "cannot be written", "NOT saved", str(store.path.parent))


def test_a_data_dir_without_permission(tmp_path, monkeypatch):
    import localpaged.ui.store.private as private

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(private.os, "open", denied)
    with pytest.raises(StoreError) as e:
        Store(tmp_path / "chat.db")
    assert_says(e.value, "readonly", "cannot be written", "Permission denied")


def test_locked_database(store):
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with store.busy_wait(50), pytest.raises(StoreError) as e:
            store.create_conversation("t")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert_says(e.value, "locked", "database is locked", "another writer")


def test_damaged_copy(store, tmp_path):
    c = store.create_conversation("big")
    for i in range(30):
        store.add_message(c.id, None, "user", f"{i} " + "x" * 3000)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    copy = tmp_path / "copy.db"
    shutil.copy(store.path, copy)
    data = bytearray(copy.read_bytes())
    data[2 * 4096:6 * 4096] = b"\x13\x37" * (2 * 4096)           # garbage over pages 3-6
    copy.write_bytes(bytes(data))
    with pytest.raises(StoreError) as e:
        Store(copy)
    assert_says(e.value, "damaged", "is damaged", "has not changed it", ".recover", str(copy))
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"\x00not sqlite" * 500)
    with pytest.raises(StoreError) as e:
        Store(garbage)
    assert_says(e.value, "damaged", "is damaged")


# -- owner-only files ----------------------------------------------------------------------

def test_new_data_dir_and_database_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        with Store(tmp_path / "new" / "data" / "chat.db") as s:
            c = s.create_conversation("t")
            s.add_message(c.id, None, "user", "secret")
            files = [s.path, Path(f"{s.path}-wal"), Path(f"{s.path}-shm")]
            assert all(f.exists() for f in files)
            assert [mode(f) for f in files] == [0o600] * 3
        assert mode(tmp_path / "new" / "data") == 0o700
    finally:
        os.umask(old)


def test_an_existing_database_readable_by_others_is_tightened(tmp_path):
    folder = tmp_path / "chosen"
    folder.mkdir()
    folder.chmod(0o755)                        # a directory the user chose keeps its mode
    db = folder / "chat.db"
    Store(db).close()
    for f in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        if f.exists():
            f.chmod(0o644)
    with Store(db) as s:
        s.create_conversation("t")
        assert mode(db) == 0o600 and mode(f"{db}-wal") == 0o600
    assert mode(folder) == 0o755
