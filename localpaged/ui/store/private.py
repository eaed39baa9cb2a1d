"""Files only their owner may read: the data directory (0700), the database and its -wal/-shm
files (0600), export files (0600 in 0700 folders). Conversations are private; the umask of the
shell that started localpaged must not decide who may read them.

Only what localpaged makes is tightened: a directory the user chose and that already existed
keeps its mode, while our own files (the database, its -wal/-shm) are set to 0600 when opened.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

DIR_MODE, FILE_MODE = 0o700, 0o600


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) with the leaf 0700; an existing one is kept as is."""
    path = Path(path)
    if not path.is_dir():
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(path, DIR_MODE)        # mkdir's mode is masked by the umask; this is not
    return path


def private_file(path: Path) -> Path:
    """Make sure `path` exists and only its owner may read or write it (0600)."""
    path = Path(path)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE))
    tighten(path)
    return path


def tighten(path: Path) -> None:
    """Drop group and other permissions from an existing file we own; absent files are fine.
    (Windows has no such modes: nothing to do there.)"""
    if os.name == "nt":
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
        log.info("%s was readable by others: now %o", path, stat.S_IMODE(st.st_mode) & 0o700)


def write_private(path: Path, text: str) -> Path:
    """Write `text` (UTF-8) to a new or truncated file created 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    tighten(path)
    return path
