"""Where export files are written: one folder per export, private to the user (0700, files
0600), under the system temp directory (Gradio serves returned files from there only, and
copies each into its cache when it is shown, keeping the 0600 mode).

Cleanup: a tab's new export removes the folder of that tab's previous one (Gradio holds its own
copy by then), and `ExportFolders()` removes the folders an earlier run left behind, those older
than `stale_s` (a second app running as the same user keeps its fresh ones). Only real folders
owned by this user and named PREFIX* are ever removed.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "localpaged-export-"
STALE_S = 3600.0


class ExportFolders:
    """The export folders of this app: `new(slot)` makes one, dropping the slot's last."""

    def __init__(self, root: Path | None = None, stale_s: float = STALE_S) -> None:
        self.root = Path(root or tempfile.gettempdir())
        self._last: dict[object, Path] = {}
        self._lock = threading.Lock()
        removed = [p for p in self._ours() if _age(p) >= stale_s and _remove(p)]
        if removed:
            log.info("removed %d old export folder(s) from %s", len(removed), self.root)

    def new(self, slot: object = None) -> Path:
        """A new empty folder (0700) for one export; the previous folder of `slot` is removed."""
        folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=self.root))   # mkdtemp makes it 0700
        with self._lock:
            old, self._last[slot] = self._last.get(slot), folder
        if old is not None:
            _remove(old)
        return folder

    def _ours(self) -> list[Path]:
        uid = os.getuid() if hasattr(os, "getuid") else None
        found = []
        for p in self.root.glob(PREFIX + "*"):
            try:
                st = p.lstat()
            except OSError:
                continue
            if p.is_dir() and not p.is_symlink() and (uid is None or st.st_uid == uid):
                found.append(p)
        return found


def _age(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except OSError:
        return 0.0


def _remove(path: Path) -> bool:
    try:
        shutil.rmtree(path)
        return True
    except OSError as e:
        log.warning("could not remove the export folder %s: %s", path, e)
        return False
