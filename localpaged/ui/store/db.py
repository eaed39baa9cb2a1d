"""The conversation store's connection: one SQLite file opened once, checked, migrated (see
`schema.py`), and the rules every store method follows. `StoreBase` is the base of `Store`
(`store.py`); the tree (`tree.py`) and export/import (`export.py`) build on it.

Durability: every write method is one transaction (`_write`), committed before it returns; WAL
mode. Nothing fails silently: a full disk, a read-only, busy or damaged file raises StoreError
naming the file and the cause (`errors.py`), and the write it interrupted is rolled back, not
half done. Privacy: the file and its folder are its owner's alone (`private.py`).

Threads: Gradio calls from worker threads, so the store holds one `sqlite3` connection opened
with `check_same_thread=False` (wrapped by `sqlite_utils.Database`) and an RLock taken by every
public method (`guarded`). Chosen over a connection per thread: worker threads come and go
(per-thread connections would leak), SQLite serializes writers anyway, and the lock keeps one
thread's statements out of another thread's open transaction on the shared connection.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from sqlite_utils import Database

from .errors import StoreError, describe, store_error
from .private import private_dir, private_file, tighten
from .fts import ensure_index, fts5_available
from .schema import PREPARED, ROLES, STATUSES, migrate

DB_FILENAME = "conversations.db"


def guarded(method):
    """Run a public method under the store's lock; SQLite errors become StoreError (full disk,
    read-only, busy or damaged file: see errors.py) or ValueError (a constraint the arguments
    broke)."""
    @functools.wraps(method)
    def wrapper(self: "StoreBase", *args, **kwargs):
        with self._lock:
            try:
                return method(self, *args, **kwargs)
            except sqlite3.IntegrityError as e:
                raise ValueError(f"{method.__name__}: {e}") from e
            except sqlite3.DatabaseError as e:
                raise self._store_error(e) from e
    return wrapper


class StoreBase:
    """The store's connection and transactions. `path` is the database file, or a directory to hold
    DB_FILENAME; missing directories are created."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 5000):
        path = Path(path).expanduser().absolute()
        self.path = path / DB_FILENAME if path.is_dir() else path
        self.busy_timeout_ms = busy_timeout_ms
        self._lock = threading.RLock()
        conn = self._connect()
        try:
            self.db = Database(conn)
            self._open()
        except BaseException as e:
            conn.close()
            if isinstance(e, sqlite3.DatabaseError):
                raise self._store_error(e) from e
            raise

    def _connect(self) -> sqlite3.Connection:
        """The connection to a file only we may read: a new data dir is 0700, the file (and
        its -wal/-shm, which SQLite creates with the file's mode) 0600."""
        try:
            private_dir(self.path.parent)
            private_file(self.path)
            for suffix in ("-wal", "-shm"):
                tighten(Path(f"{self.path}{suffix}"))
            return sqlite3.connect(self.path, check_same_thread=False,
                                   timeout=self.busy_timeout_ms / 1000)
        except (OSError, sqlite3.Error) as e:
            raise self._store_error(e) from e

    def _open(self) -> None:
        self._set_busy_timeout(self.busy_timeout_ms)
        self.db.execute("PRAGMA foreign_keys = ON")
        problems = [row[0] for row in self.db.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise StoreError(describe("damaged", self.path,
                                      f"PRAGMA quick_check: {'; '.join(problems[:5])}"),
                             "damaged")
        self.db.enable_wal()
        migrate(self.db, self.path)
        self.fts = ensure_index(self.db, self.path, fts5_available(self.db))  # search: fts.py

    def _store_error(self, e: BaseException) -> StoreError:
        return store_error(e, self.path, self.busy_timeout_ms)

    @contextlib.contextmanager
    def busy_wait(self, ms: int) -> Iterator[None]:
        """Store calls made inside wait at most `ms` for a busy file (instead of
        busy_timeout_ms), holding the store's lock no longer: for a writer that retries on its
        own. Other threads' calls wait for the block to end."""
        with self._lock:
            self._set_busy_timeout(ms)
            try:
                yield
            finally:
                self._set_busy_timeout(self.busy_timeout_ms)

    def _set_busy_timeout(self, ms: int) -> None:
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(ms)}")
        except sqlite3.Error as e:
            raise self._store_error(e) from e

    def close(self) -> None:
        with self._lock:
            self.db.conn.close()

    def __enter__(self) -> "StoreBase":
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

    def _row(self, table: str, row_id: int, what: str) -> dict:
        """The row of `table` ("conversations", "messages") with this id; KeyError naming
        `what` when there is none."""
        rows = self._rows(f"SELECT * FROM {table} WHERE id = ?", [row_id])
        if not rows:
            raise KeyError(f"no {what} {row_id}")
        return rows[0]

    def _touch(self, conversation_id: int) -> None:
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?",
                        [time.time(), conversation_id])

    def _check(self, role: str | None = None, status: str | None = None,
               prepared: str | None = None) -> None:
        if prepared not in PREPARED:
            raise ValueError(f"prepared must be one of {PREPARED}, not {prepared!r}")
        if role is not None and role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")

