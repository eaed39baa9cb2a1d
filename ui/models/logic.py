"""The model behind the chat app: building a backend (local engine or remote server) and
swapping it for another model, loaded in a background thread with progress.

A load that fails leaves the current model in place and says why. When a new model is ready,
the new backend takes over (and, when `served` is set, the /v1 API's ServedModel moves to its
engine), running generations on the old one are stopped (their text is kept) and the old
engine is shut down.

Quantization: a factory that can load weights in several formats says so with a `quantization`
attribute (its default, the CLI's --quantization); a load may choose another (`load(name,
quantization=...)`). Remote backends have none. The header's weights format comes from the
backend's public `stats()` (EngineStats.weights_format), never from the engine's internals.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from localpaged.chat.backend import ChatBackend
from localpaged.core.config import QUANTIZATION, check_choice, default

from ..markdown import literal

if TYPE_CHECKING:
    from localpaged.api import ServedModel

log = logging.getLogger(__name__)

Progress = Callable[[str, str], None]          # (phase, detail)
Factory = Callable[..., ChatBackend]           # (name, progress[, quantization=...])

# For models whose tokenizer has no chat template (base models, test models): ChatML.
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@dataclass
class LoadJob:
    name: str
    quantization: str | None = None   # None: the factory's default
    phase: str = "starting"       # starting | resolving | downloading | loading | ready | failed
    detail: str = ""
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started


class ModelManager:
    def __init__(self, factory: Factory, on_swap: Callable[[], None] | None = None,
                 backend: ChatBackend | None = None, served: ServedModel | None = None) -> None:
        self._factory = factory
        self.on_swap = on_swap
        self.served = served               # the /v1 API's model: follows the chat's on a switch
        self._backend = backend
        self._lock = threading.Lock()
        self.job: LoadJob | None = None
        # The picker's default weight format; None: this factory offers no choice (remote).
        self.quantization: str | None = getattr(factory, "quantization", None)

    @property
    def backend(self) -> ChatBackend | None:
        return self._backend

    @property
    def model_name(self) -> str | None:
        return getattr(self._backend, "model_name", None)

    @property
    def weights_format(self) -> str:
        """E.g. "int4 g32 · 95 MB" for a local engine; "" for a remote backend or no model."""
        stats = self._backend.stats() if self._backend is not None else None
        return getattr(stats, "weights_format", "") if stats is not None else ""

    def loading(self) -> bool:
        return self.job is not None and not self.job.done.is_set()

    def load(self, name: str, quantization: str | None = None) -> LoadJob:
        """Start loading `name` in the background (the running job, if one is running), with
        `quantization` (one of config.QUANTIZATION; None: the factory's default)."""
        name = name.strip()
        if quantization is not None:
            if self.quantization is None:
                raise ValueError("quantization: this backend loads no weights itself (remote); "
                                 "leave it unset")
            check_choice("quantization", quantization, QUANTIZATION)
        with self._lock:
            if self.loading():
                return self.job
            if not name:
                raise ValueError("type a Hugging Face Hub id or a local path")
            self.job = job = LoadJob(name, quantization)
        threading.Thread(target=self._run, args=(job,), name="model-load", daemon=True).start()
        return job

    def _run(self, job: LoadJob) -> None:
        def progress(phase: str, detail: str = "") -> None:
            job.phase, job.detail = phase, detail
        try:
            options = {} if job.quantization is None else {"quantization": job.quantization}
            backend = self._factory(job.name, progress, **options)
        except Exception as exc:  # noqa: BLE001 - any failure: keep the current model
            log.warning("could not load model %s: %s", job.name, exc)
            job.error, job.phase = f"{type(exc).__name__}: {exc}", "failed"
        else:
            old, self._backend = self._backend, backend
            self._serve(backend)
            job.phase, job.detail = "ready", ""
            if old is not None:
                self._retire(old)
        job.finished = time.monotonic()
        job.done.set()

    def _serve(self, backend: ChatBackend) -> None:
        """Point the API at the new engine (aborting its requests on the old one)."""
        engine = getattr(backend, "engine", None)
        if self.served is not None and engine is not None:
            self.served.swap(engine, backend.model_name)

    def _retire(self, old: ChatBackend) -> None:
        if self.on_swap:
            self.on_swap()                 # stops running generations on the old model
        shutdown = getattr(getattr(old, "engine", None), "shutdown", None)
        if shutdown:
            threading.Timer(2.0, shutdown).start()   # let the stops reach their streams

    def status(self) -> str:
        """Markdown for the model panel: names, progress and errors are user or server text,
        so each shows literally (`markdown.literal`)."""
        job, current = self.job, self.model_name
        if job and not job.done.is_set():
            detail = f": {job.detail}" if job.detail else ""
            return (f"Loading **{literal(job.name)}** — {literal(job.phase + detail)} "
                    f"({job.elapsed():.0f} s)")
        if job and job.error:
            keep = f"Still using **{literal(current)}**." if current else "No model is loaded."
            return f"⚠ Could not load **{literal(job.name)}**: {literal(job.error)}\n\n{keep}"
        if current:
            return f"✓ Loaded **{literal(job.name)}** in {job.elapsed():.0f} s" if job else "✓ Ready"
        return "No model loaded."


@dataclass
class LocalFactory:
    """Builds a LocalChatBackend on our engine; Hub ids are fetched first, with progress.
    `quantization` is the default weight format (the CLI flag); one load may pick another.
    `engine_options`: further EngineConfig fields (max_model_len, attention_backend,
    enforce_eager); None leaves a field at its default."""
    num_kv_blocks: int | None = None
    dtype: str = default("dtype")
    quantization: str = default("quantization")
    engine_options: dict = field(default_factory=dict)

    def __call__(self, name: str, progress: Progress,
                 quantization: str | None = None) -> ChatBackend:
        from localpaged.chat.backend import LocalChatBackend
        from localpaged.engine.async_engine import AsyncEngine
        from localpaged.engine.llm import LLM
        progress("resolving", name)
        if _looks_like_hub_id(name):
            _download(name, progress)
        progress("loading", "weights into the engine")
        kwargs = {"dtype": self.dtype, "num_kv_blocks": self.num_kv_blocks or None,
                  "quantization": quantization or self.quantization, **self.engine_options}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        llm = LLM(name, **kwargs)
        if not getattr(llm.tokenizer, "chat_template", None):
            log.warning("%s has no chat template: using ChatML", name)
            llm.tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
        return LocalChatBackend(AsyncEngine(llm.engine))


def local_factory(num_kv_blocks: int | None = None, dtype: str = default("dtype"),
                  quantization: str | None = None, **engine_options) -> LocalFactory:
    """A LocalFactory; `quantization` None means EngineConfig's default."""
    return LocalFactory(num_kv_blocks, dtype, quantization or default("quantization"),
                        engine_options)


def _looks_like_hub_id(name: str) -> bool:
    return ("/" in name and not name.startswith((".", "/", "~")) and not os.path.exists(name)
            and name.count("/") == 1)


def _download(repo_id: str, progress: Progress) -> None:
    """Fetch the files the loader needs into the HF cache, reporting files done / total. A
    failure is not fatal here: the loader then explains what it tried (cache, bundled copy)."""
    from huggingface_hub import constants, snapshot_download
    from tqdm.auto import tqdm

    from localpaged.runner.loader import HUB_PATTERNS
    if constants.HF_HUB_OFFLINE:
        return

    class Bar(tqdm):
        def update(self, n=1):
            out = super().update(n)
            progress("downloading", f"{self.n}/{self.total or '?'} files")
            return out

    progress("downloading", "contacting the Hub")
    try:
        snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, tqdm_class=Bar)
    except Exception as exc:  # noqa: BLE001
        log.info("download of %s failed (%s); the loader tries the cache next", repo_id, exc)
