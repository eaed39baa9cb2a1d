"""The Hugging Face Hub, for the model manager: search (HfApi.list_models) and download into the
HF cache (snapshot_download) with byte progress. No Gradio here.

Offline (HF_HUB_OFFLINE, or no network) each call raises `HubUnavailable` whose message says
so in words a user reads ("the Hub cannot be reached ..."), never a traceback. The HfApi and
the download function are parameters, so tests pass fakes and never touch the network.

Progress: snapshot_download (huggingface_hub 2) builds its bars from `tqdm_class`: a bytes bar
(unit "B") whose total grows as each file's size becomes known, and a files bar. `_bars`
makes a tqdm class that reports both to a `DownloadProgress` (bytes done / known total,
files done / total); the bars themselves print nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

SEARCH_LIMIT = 20


class HubUnavailable(RuntimeError):
    """The Hub could not be reached (offline, no network, or it refused): the message says
    which, for the user."""


@dataclass(frozen=True)
class HubModel:
    repo_id: str
    downloads: int | None = None
    likes: int | None = None
    pipeline_tag: str | None = None


@dataclass
class DownloadProgress:
    """What a running download has done; written by the download's thread, read by the UI."""
    repo_id: str
    bytes_done: int = 0
    bytes_total: int = 0             # grows while files are being looked up
    files_done: int = 0
    files_total: int = 0
    path: str | None = None          # the snapshot folder, once done
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def fraction(self) -> float | None:
        if self.done.is_set() and not self.error:
            return 1.0
        if self.bytes_total:
            return min(1.0, self.bytes_done / self.bytes_total)
        return self.files_done / self.files_total if self.files_total else None


def offline() -> bool:
    from huggingface_hub import constants
    return bool(constants.HF_HUB_OFFLINE)


def _unavailable(what: str, exc: Exception | None = None) -> HubUnavailable:
    if exc is None:
        return HubUnavailable(f"{what}: the Hub cannot be reached: offline mode is on "
                              "(HF_HUB_OFFLINE). Models already on this machine are listed above.")
    return HubUnavailable(f"{what}: the Hub cannot be reached ({type(exc).__name__}); "
                          "check the network connection. Models already on this machine are "
                          "listed above.")


def search(query: str, api=None, limit: int = SEARCH_LIMIT) -> list[HubModel]:
    """Text-generation models whose id matches `query`, most downloaded first."""
    query = " ".join((query or "").split())
    if not query:
        raise ValueError("type part of a model's name to search the Hub")
    if offline():
        raise _unavailable(f"search for {query!r}")
    if api is None:
        from huggingface_hub import HfApi
        api = HfApi()
    try:
        found = list(api.list_models(search=query, pipeline_tag="text-generation",
                                     sort="downloads", limit=limit))
    except Exception as exc:  # noqa: BLE001 - any transport or HTTP failure: one clear message
        log.info("Hub search %r failed: %s", query, exc)
        raise _unavailable(f"search for {query!r}", exc) from exc
    return [HubModel(m.id, getattr(m, "downloads", None), getattr(m, "likes", None),
                     getattr(m, "pipeline_tag", None)) for m in found]


def download(repo_id: str, progress: DownloadProgress, patterns: list[str] | None = None,
             snapshot_download: Callable | None = None) -> str:
    """Fetch `repo_id`'s loadable files (`patterns`: the loader's HUB_PATTERNS by default) into
    the HF cache, reporting to `progress`; returns the snapshot folder. Sets progress.done
    (and progress.error on failure) before returning or raising."""
    from localpaged.runner.model_source import HUB_PATTERNS
    try:
        if offline():
            raise _unavailable(f"download of {repo_id}")
        if snapshot_download is None:
            from huggingface_hub import snapshot_download
        try:
            path = snapshot_download(repo_id, allow_patterns=patterns or HUB_PATTERNS,
                                     tqdm_class=_bars(progress))
        except Exception as exc:  # noqa: BLE001
            log.info("download of %s failed: %s", repo_id, exc)
            if type(exc).__name__ in ("RepositoryNotFoundError", "GatedRepoError",
                                      "RevisionNotFoundError"):
                raise HubUnavailable(f"download of {repo_id}: {type(exc).__name__} (no such "
                                     "public model, or it needs a login)") from exc
            raise _unavailable(f"download of {repo_id}", exc) from exc
        progress.path = str(path)
        return progress.path
    except HubUnavailable as exc:
        progress.error = str(exc)
        raise
    finally:
        progress.done.set()


def start_download(repo_id: str, **options) -> DownloadProgress:
    """`download` in a background thread; its DownloadProgress at once."""
    progress = DownloadProgress(repo_id)

    def run() -> None:
        try:
            download(repo_id, progress, **options)
        except HubUnavailable:
            pass                                  # said in progress.error
        except Exception as exc:  # noqa: BLE001 - the UI shows it; the thread must not die loud
            progress.error = f"download of {repo_id}: {type(exc).__name__}: {exc}"
            progress.done.set()
    threading.Thread(target=run, name=f"download-{repo_id}", daemon=True).start()
    return progress


def _bars(progress: DownloadProgress) -> type:
    """A tqdm class whose bars print nothing and copy their counts into `progress`: the bar of
    bytes written (unit "B"; not the network-transfer bar, "Downloading bytes") to bytes_done /
    bytes_total, the bar of files to files_done / files_total."""

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["file"] = _Null()
            unit, desc = kwargs.get("unit"), str(kwargs.get("desc") or "")
            self._role = ("transfer" if desc.startswith("Downloading bytes") else
                          "bytes" if unit == "B" else "files")     # before tqdm's refresh
            super().__init__(*args, **kwargs)
            self._report()

        def _report(self) -> None:
            if self._role == "bytes":
                progress.bytes_done, progress.bytes_total = int(self.n), int(self.total or 0)
            elif self._role == "files":
                progress.files_done, progress.files_total = int(self.n), int(self.total or 0)

        def update(self, n=1):
            out = super().update(n)
            self._report()
            return out

        def refresh(self, *args, **kwargs):
            out = super().refresh(*args, **kwargs)
            self._report()              # snapshot_download raises a bar's total, then refreshes
            return out

    return Bar


class _Null:
    """Where the bars write: nowhere (the UI shows `DownloadProgress`)."""

    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass
