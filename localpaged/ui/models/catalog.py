"""The model manager's lists, in plain Python (no Gradio): the models on this machine as table
rows (runner/model_catalog.py: the HF cache and the watched folders), Hub search results as rows
(runner/hub_client.py), and the download running in the background.

Rows are plain strings and numbers; the view shows them as text (a file name is untrusted).
The last column of a local row is what the loader takes (`name`): choosing a row puts it in the
model box.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from localpaged.runner import hub_client
from localpaged.runner.model_catalog import ModelEntry, human_bytes, human_count, scan

from .memory import ModelMemory

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = 4096
LOCAL_HEADERS = ["Model", "Format", "Size", "Parameters", "Memory at context", "Load as"]
HUB_HEADERS = ["Hub id", "Downloads", "Likes"]


@dataclass
class Catalog:
    """The lists of one app: `memory` holds the watched folders; `scan_models` and `hub_api`
    are what to read (tests give a fake cache folder or a fake HfApi)."""
    memory: ModelMemory
    cache_dir: str | None = None
    hub_api: object | None = None
    scan_models: Callable[[list[str], str | None], list[ModelEntry]] = scan

    def __post_init__(self) -> None:
        self.download: hub_client.DownloadProgress | None = None

    # ---- on this machine -------------------------------------------------------------------
    def entries(self) -> list[ModelEntry]:
        return self.scan_models(self.memory.folders(), self.cache_dir)

    def rows(self, context: int | float | None = None) -> list[list[str]]:
        """One row per model: name, format, size on disk, parameters, memory at `context`
        tokens (weights + one sequence's KV), what to load."""
        ctx = _context(context)
        return [[_label(e), e.format, human_bytes(e.size_bytes), human_count(e.parameters),
                 _memory(e, ctx), e.name] for e in self.entries()]

    def add_folder(self, folder: str) -> str:
        """Watch `folder`; the note to show (what it holds). ValueError for a bad path."""
        before = set(self.memory.folders())
        folders = self.memory.add_folder(folder)
        added = [f for f in folders if f not in before]
        if not added:
            return f"Already watching {folder.strip()}."
        found = sum(e.source == added[0] for e in self.entries())
        return f"Watching {added[0]}: {found} GGUF file(s) found there."

    # ---- the Hub ---------------------------------------------------------------------------
    def search(self, query: str) -> list[list]:
        """Hub models matching `query` as rows; ValueError or HubUnavailable saying why not."""
        found = hub_client.search(query, api=self.hub_api)
        return [[m.repo_id, m.downloads if m.downloads is not None else "",
                 m.likes if m.likes is not None else ""] for m in found]

    def start_download(self, repo_id: str, **options) -> hub_client.DownloadProgress:
        """A background download of `repo_id` (the running one while one runs)."""
        repo_id = (repo_id or "").strip()
        if self.download is not None and not self.download.done.is_set():
            return self.download
        if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
            raise ValueError("choose a Hub id (owner/name) from the search results, or type one")
        self.download = hub_client.start_download(repo_id, **options)
        return self.download


def download_status(job: hub_client.DownloadProgress | None) -> str:
    """Plain text (the caller escapes it): the download's progress or how it ended."""
    if job is None:
        return ""
    if job.error:
        return f"⚠ {job.error}"
    if job.done.is_set():
        return f"✓ Downloaded {job.repo_id} (100%): it is in the list of models on this machine."
    pct = f"{int(job.fraction * 100)}% · " if job.fraction is not None else ""
    return f"Downloading {job.repo_id} — {pct}{download_text(job)}"


def download_text(job) -> str:
    """"12.5 MB of 270.1 MB (4%), 3/9 files" for a hub_client.DownloadProgress."""
    parts = []
    if job.bytes_total:
        parts.append(f"{human_bytes(job.bytes_done)} of {human_bytes(job.bytes_total)} "
                     f"({int(100 * job.bytes_done / job.bytes_total)}%)")
    if job.files_total:
        parts.append(f"{job.files_done}/{job.files_total} files")
    return ", ".join(parts) or "contacting the Hub"


def _context(context: int | float | None) -> int:
    try:
        ctx = int(context or 0)
    except (TypeError, ValueError):
        ctx = 0
    return ctx if ctx > 0 else DEFAULT_CONTEXT


def _label(entry: ModelEntry) -> str:
    """A Hub id as it is; a file by its name (the path is in the last column)."""
    return entry.name.rsplit("/", 1)[-1] if entry.name.endswith(".gguf") else entry.name


def _memory(entry: ModelEntry, context: int) -> str:
    total = entry.memory_at(context)
    if total is None:
        return entry.error and "? (unreadable)" or "?"
    kv = total - (entry.weights_bytes or entry.size_bytes)
    return f"{human_bytes(total)} ({human_bytes(kv)} KV)"
