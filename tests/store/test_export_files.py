"""Export files (ui/export/files.py, events.py): written 0600 into a 0700 folder of their own,
a tab's previous export folder removed by its next export, old folders removed at start."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from localpaged.ui.export.events import export_files
from localpaged.ui.export.files import PREFIX, ExportFolders
from localpaged.ui.store import StoreError


class FakeController:
    def export(self, cid, fmt="markdown"):
        return f"# chat {cid}\n" if fmt == "markdown" else f'{{"id": {cid}}}'


def mode(path) -> int:
    return stat.S_IMODE(Path(path).stat().st_mode)


def test_exports_are_private_and_replace_the_tabs_last(tmp_path):
    old = os.umask(0o022)
    try:
        folders = ExportFolders(tmp_path)
        md, js = export_files(FakeController(), 7, slot=0, folders=folders)
    finally:
        os.umask(old)
    assert md.read_text(encoding="utf-8") == "# chat 7\n" and js.read_text() == '{"id": 7}'
    assert (mode(md), mode(js), mode(md.parent)) == (0o600, 0o600, 0o700)
    assert md.parent.parent == tmp_path and md.parent.name.startswith(PREFIX)
    other_tab = export_files(FakeController(), 8, slot=1, folders=folders)
    again = export_files(FakeController(), 7, slot=0, folders=folders)
    assert not md.parent.exists()                      # tab 0's last export is gone
    assert other_tab[0].exists() and again[0].exists()  # tab 1's is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [other_tab[0].parent.name, again[0].parent.name])


def test_old_export_folders_are_removed_at_start(tmp_path):
    stale, fresh = tmp_path / f"{PREFIX}stale", tmp_path / f"{PREFIX}fresh"
    for folder in (stale, fresh):
        folder.mkdir()
        (folder / "conversation-1.md").write_text("old")
    hour_ago = time.time() - 7200
    os.utime(stale, (hour_ago, hour_ago))
    target = tmp_path / "not-an-export"
    target.mkdir()
    (tmp_path / f"{PREFIX}link").symlink_to(target)     # never followed, never removed
    (tmp_path / "unrelated").mkdir()
    ExportFolders(tmp_path)
    assert not stale.exists() and fresh.exists()         # a fresh one may be another app's
    assert target.exists() and (tmp_path / f"{PREFIX}link").is_symlink()
    assert (tmp_path / "unrelated").exists()
    ExportFolders(tmp_path, stale_s=0)
    assert not fresh.exists()


def test_an_export_that_cannot_be_written_says_why(tmp_path):
    with pytest.raises(StoreError, match="could not write the export into") as e:
        export_files(FakeController(), 1, folders=ExportFolders(tmp_path / "missing"))
    assert e.value.cause == "io"
