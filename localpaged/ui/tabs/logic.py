"""The tabs a user had open, remembered across reloads and restarts: a small JSON file
(`{"open": [conversation ids], "current": conversation id}`) beside the store. A missing or
unreadable file means none open and no current tab; a file written before "current" existed
reads as the first tab current."""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


class OpenTabsFile:
    """What this instance wrote last is kept in memory while the file's size and modification
    time still match it (a streaming reply asks for the selected tab 10-20 times a second,
    ui/redraw.py RedrawInterval); anything else is read from the file."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._written: tuple[tuple[int, int], dict] | None = None   # ((mtime_ns, size), contents)

    def _key(self) -> tuple[int, int]:
        st = self.path.stat()
        return st.st_mtime_ns, st.st_size

    def _read(self) -> dict:
        if self.path is None:
            return {}
        try:
            if self._written is not None and self._written[0] == self._key():
                return self._written[1]
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def read(self) -> list[int]:
        cids = self._read().get("open")
        return [c for c in cids if _is_id(c)] if isinstance(cids, list) else []

    def read_current(self) -> int | None:
        """The conversation whose tab was selected last (None: unknown)."""
        cid = self._read().get("current")
        return cid if _is_id(cid) else None

    def write(self, cids: list[int], current: int | None = None) -> None:
        """The open tabs in order; `current` (one of them) is the selected tab's conversation."""
        if self.path is None:
            return
        cids = [c for c in cids if c]
        data = {"open": cids, "current": current if current in cids else None}
        self._written = None
        try:
            self.path.write_text(json.dumps(data))
            self._written = (self._key(), data)
        except OSError:
            log.exception("could not save the open tabs to %s", self.path)


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
