"""Why the store cannot be used: `StoreError` and the cause it names, read from SQLite's error
code (or the OSError's errno), falling back to the message text for errors raised without one.

Causes (`StoreError.cause`):
  full      SQLITE_FULL, ENOSPC/EDQUOT: the disk (or quota) is full
  readonly  SQLITE_READONLY / PERM / CANTOPEN, EACCES/EPERM/EROFS: no permission to write
  locked    SQLITE_BUSY / LOCKED: another writer held the file past the busy timeout
  damaged   SQLITE_CORRUPT / NOTADB: the file is damaged or not a SQLite database
  io        SQLITE_IOERR, other OSErrors: reading or writing the file failed
  closed    the store was closed
  other     anything else (the message quotes SQLite)
Every message names the file and what the user can do; none suggests moving the file aside (a
user who does that sees their conversations gone).
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

CAUSES = ("full", "readonly", "locked", "damaged", "io", "closed", "other")


class StoreError(Exception):
    """The database file cannot be used; `cause` is one of CAUSES and the message names the
    file and what to do."""

    def __init__(self, message: str, cause: str = "other") -> None:
        super().__init__(message)
        self.cause = cause


_BY_CODE = {13: "full", 8: "readonly", 3: "readonly", 14: "readonly", 5: "locked", 6: "locked",
            11: "damaged", 26: "damaged", 10: "io"}
_BY_TEXT = (("disk is full", "full"), ("readonly", "readonly"), ("read-only", "readonly"),
            ("unable to open", "readonly"), ("locked", "locked"), ("busy", "locked"),
            ("malformed", "damaged"), ("not a database", "damaged"), ("disk i/o", "io"),
            ("closed", "closed"))
_BY_ERRNO = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EACCES: "readonly",
             errno.EPERM: "readonly", errno.EROFS: "readonly"}


def cause_of(e: BaseException) -> str:
    """The cause (one of CAUSES) of an sqlite3.Error or OSError."""
    if isinstance(e, OSError):
        return _BY_ERRNO.get(e.errno, "io")
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _BY_CODE:
        return _BY_CODE[code & 0xFF]
    text = str(e).lower()
    return next((cause for words, cause in _BY_TEXT if words in text), "other")


def store_error(e: BaseException, path: Path, busy_timeout_ms: int) -> StoreError:
    """A StoreError saying why `path` could not be used, from the error that said so."""
    cause = cause_of(e)
    return StoreError(describe(cause, path, str(e), busy_timeout_ms), cause)


def describe(cause: str, path: Path, detail: str, busy_timeout_ms: int = 0) -> str:
    folder = Path(path).parent
    return {
        "full": f"the disk holding {path} is full ({detail}): the change was NOT saved. "
                "Free some space on it, then retry",
        "readonly": f"{path} cannot be written ({detail}): the change was NOT saved. Check that "
                    f"your user may write both the file and its folder {folder} (and that the "
                    "disk is not mounted read-only), or start localpaged with another --data-dir",
        "locked": f"database is locked: {path} was held by another writer for longer than "
                  f"{busy_timeout_ms} ms; the change was NOT saved. Close the other program "
                  "(another localpaged?) using this file, then retry",
        "damaged": f"{path} is damaged ({detail}); localpaged has not changed it. Restore it "
                   f"from a backup, or rescue what it holds with `sqlite3 {path} .recover`",
        "io": f"reading or writing {path} failed ({detail}): the change was NOT saved. The disk "
              "may be failing or was disconnected",
        "closed": f"the store on {path} is closed",
    }.get(cause, f"{path} cannot be used ({detail}): the change was NOT saved")
