"""One app per data directory: an exclusive lock on `<data dir>/localpaged.lock`, held for the
life of the process, naming the running app (pid and URL).

    lock = InstanceLock.acquire(data_dir, "http://127.0.0.1:7860")   # raises InstanceRunning
    ...                                                               # open the store, serve
    lock.release()

Invariant: while a process holds the lock no other process opens the store of that directory
for writing, so start-up may mark 'streaming' replies as interrupted only after `acquire`.
The lock is an OS file lock (`fcntl.flock`, or `msvcrt.locking` on Windows): the kernel drops it
when its process dies, even by kill -9, so a stale lock file is simply taken over.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_FILENAME = "localpaged.lock"

try:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
except ImportError:                                          # Windows
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False


class InstanceRunning(RuntimeError):
    """Another live process holds the data directory; `url` says where it serves."""

    def __init__(self, data_dir: Path, pid: int | None, url: str | None) -> None:
        self.pid, self.url = pid, url
        where = f"at {url}" if url else "(its address is unknown)"
        super().__init__(f"localpaged is already running on {data_dir} {where}"
                         + (f", pid {pid}" if pid else "")
                         + ": open that one, stop it first, or use another --data-dir")


@dataclass
class InstanceLock:
    path: Path
    fd: int | None

    @classmethod
    def acquire(cls, data_dir: Path, url: str) -> "InstanceLock":
        """Take the data directory's lock and record our pid and url in it."""
        path = Path(data_dir) / LOCK_FILENAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if not _try_lock(fd):
            os.close(fd)
            pid, owner_url = read_owner(path)
            raise InstanceRunning(Path(data_dir), pid, owner_url)
        # The holder writes its owner record right after locking; a reader that finds the
        # lock taken and the record still empty polls briefly (read_owner).
        record = json.dumps({"pid": os.getpid(), "url": url}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.ljust(max(len(record), 1)), 0)
        os.fsync(fd)
        return cls(path, fd)

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases it); the file stays, it is harmless."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def read_owner(path: Path, timeout: float = 2.0) -> tuple[int | None, str | None]:
    """(pid, url) recorded in a lock file, polling up to `timeout` while it is being written."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = json.loads(Path(path).read_text() or "null")
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            return data.get("pid"), data.get("url")
        if time.monotonic() > deadline:
            return None, None
        time.sleep(0.05)
