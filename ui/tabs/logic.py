"""The tabs a user had open, remembered across reloads and restarts: a small JSON file
(`{"open": [conversation ids]}`) beside the store. A missing or unreadable file means none."""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


class OpenTabsFile:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None

    def read(self) -> list[int]:
        try:
            cids = json.loads(self.path.read_text())["open"] if self.path else []
        except (OSError, ValueError, KeyError, TypeError):
            return []
        return [c for c in cids if isinstance(c, int)] if isinstance(cids, list) else []

    def write(self, cids: list[int]) -> None:
        if self.path is None:
            return
        try:
            self.path.write_text(json.dumps({"open": [c for c in cids if c]}))
        except OSError:
            log.exception("could not save the open tabs to %s", self.path)
