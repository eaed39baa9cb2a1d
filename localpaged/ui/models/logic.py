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

Progress: a factory reports `progress(phase, detail)` (the CLI's start-up passes its own); the
local one puts the load's percentage in the detail ("reading tensors (120/272) · 47%") and,
given `fraction=` (a callable; ModelManager passes it to a factory whose `reports_fraction` is
set), the fraction itself (runner/load_progress.py `reporting_progress`). `LoadJob.fraction` only
grows (a load's parts may report in any order) and is 1.0 once the model is ready.

Memory (`memory`, a models.memory.ModelMemory, set by the CLI): a load that succeeds is
remembered as the last model, with its weights format and context length as that model's
defaults; its remembered sampling, if any, becomes the new chats' default.
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
from .catalog import Catalog, download_text
from .memory import MemoryStore, ModelMemory

if TYPE_CHECKING:
    from localpaged.api import ServedModel

log = logging.getLogger(__name__)

Progress = Callable[[str, str], None]          # (phase, detail)
Factory = Callable[..., ChatBackend]     # (name, progress[, quantization=, max_model_len=,
#                                          fraction=])

# For models whose tokenizer has no chat template (base models, test models): ChatML.
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@dataclass
class LoadJob:
    name: str
    quantization: str | None = None   # None: the factory's default
    max_model_len: int | None = None  # None: the factory's default context length
    phase: str = "starting"       # starting | resolving | downloading | loading | ready | failed
    detail: str = ""
    fraction: float = 0.0         # of the load, 0..1; never decreases; 1.0 when ready
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def report(self, phase: str, detail: str = "") -> None:
        self.phase, self.detail = phase, detail

    def advance(self, fraction: float) -> None:
        self.fraction = max(self.fraction, min(1.0, float(fraction)))

    def percent(self) -> int:
        return int(self.fraction * 100)


class ModelManager:
    def __init__(self, factory: Factory, on_swap: Callable[[], None] | None = None,
                 backend: ChatBackend | None = None, served: ServedModel | None = None) -> None:
        self._factory = factory
        self.on_swap = on_swap
        self.served = served               # the /v1 API's model: follows the chat's on a switch
        self._backend = backend
        self._lock = threading.Lock()
        self.job: LoadJob | None = None
        self.memory: ModelMemory | None = None    # remembers loads (the CLI sets it)
        self._catalog: Catalog | None = None
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

    @property
    def context_length(self) -> int | None:
        """The loaded engine's context (EngineInfo.max_model_len); None for a remote backend."""
        info = getattr(getattr(self._backend, "engine", None), "info", None)
        return getattr(info, "max_model_len", None)

    @property
    def catalog(self) -> Catalog:
        """The model lists, over `memory` (an in-memory one until the CLI sets the store's)."""
        if self.memory is None:
            self.memory = ModelMemory(MemoryStore())
        if self._catalog is None or self._catalog.memory is not self.memory:
            self._catalog = Catalog(self.memory)
        return self._catalog

    def loading(self) -> bool:
        return self.job is not None and not self.job.done.is_set()

    def load(self, name: str, quantization: str | None = None,
             max_model_len: int | None = None) -> LoadJob:
        """Start loading `name` in the background (the running job, if one is running), with
        `quantization` (one of config.QUANTIZATION; None: the factory's default) and a context
        of `max_model_len` tokens (None: the factory's default)."""
        name = name.strip()
        if max_model_len is not None and (self.quantization is None or int(max_model_len) < 1):
            raise ValueError("context length: a positive number of tokens, for a local model")
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
            self.job = job = LoadJob(name, quantization,
                                     None if max_model_len is None else int(max_model_len))
        threading.Thread(target=self._run, args=(job,), name="model-load", daemon=True).start()
        return job

    def _run(self, job: LoadJob) -> None:
        try:
            options = {k: v for k, v in (("quantization", job.quantization),
                                         ("max_model_len", job.max_model_len)) if v is not None}
            if getattr(self._factory, "reports_fraction", False):
                options["fraction"] = job.advance
            backend = self._factory(job.name, job.report, **options)
        except Exception as exc:  # noqa: BLE001 - any failure: keep the current model
            log.warning("could not load model %s: %s", job.name, exc)
            job.error, job.phase = f"{type(exc).__name__}: {exc}", "failed"
        else:
            old, self._backend = self._backend, backend
            self._serve(backend)
            job.report("ready", "")
            job.advance(1.0)
            if old is not None:
                self._retire(old)
            self._remember(job)
        job.finished = time.monotonic()
        job.done.set()

    def _remember(self, job: LoadJob) -> None:
        if self.memory is None:
            return
        try:
            self.memory.loaded(job.name, job.quantization or self.quantization, job.max_model_len)
        except Exception:  # noqa: BLE001 - the model is loaded; forgetting it is not fatal
            log.exception("could not remember the load of %s", job.name)

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
            pct = "" if "%" in job.detail else f"{job.percent()}% · "
            return (f"Loading **{literal(job.name)}** — {pct}{literal(job.phase + detail)} "
                    f"({job.elapsed():.0f} s)")
        if job and job.error:
            keep = f"Still using **{literal(current)}**." if current else "No model is loaded."
            return f"⚠ Could not load **{literal(job.name)}**: {literal(job.error)}\n\n{keep}"
        if current:
            return (f"✓ Loaded **{literal(job.name)}** in {job.elapsed():.0f} s (100%)" if job
                    else "✓ Ready")
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

    reports_fraction = True          # takes `fraction=` (see the module doc)

    def __call__(self, name: str, progress: Progress, quantization: str | None = None,
                 max_model_len: int | None = None,
                 fraction: Callable[[float], None] | None = None) -> ChatBackend:
        from localpaged.chat.backend import LocalChatBackend
        from localpaged.engine.async_engine import AsyncEngine
        from localpaged.runner.load_progress import reporting_progress
        def loading(done: float, what: str) -> None:
            progress("loading", f"{what} · {int(done * 100)}%")
            if fraction is not None:
                fraction(done)
        progress("resolving", name)
        if _looks_like_hub_id(name):
            _download(name, progress)
        progress("loading", "weights into the engine")
        kwargs = {"dtype": self.dtype, "num_kv_blocks": self.num_kv_blocks or None,
                  "quantization": quantization or self.quantization, **self.engine_options}
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        with reporting_progress(loading):
            llm = _engine(name, kwargs)
        loading(0.99, "KV cache allocated")
        if not getattr(llm.tokenizer, "chat_template", None):
            log.warning("%s has no chat template: using ChatML", name)
            llm.tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
        return LocalChatBackend(AsyncEngine(llm.engine))


def _engine(name: str, kwargs: dict):
    """LLM(name, **kwargs); a --draft-model whose tokenizer is not this model's (a model picked
    in the app after the start) is left out with a warning, drafting from n-grams only, rather
    than failing the load."""
    from localpaged.engine.draft_model import DraftTokenizerMismatch
    from localpaged.engine.llm import LLM
    try:
        return LLM(name, **kwargs)
    except DraftTokenizerMismatch as exc:
        log.warning("%s: loading %s with n-gram drafts only", exc, name)
        return LLM(name, **{**kwargs, "speculation": "ngram", "draft_model": None})


def local_factory(num_kv_blocks: int | None = None, dtype: str = default("dtype"),
                  quantization: str | None = None, **engine_options) -> LocalFactory:
    """A LocalFactory; `quantization` None means EngineConfig's default."""
    return LocalFactory(num_kv_blocks, dtype, quantization or default("quantization"),
                        engine_options)


def _looks_like_hub_id(name: str) -> bool:
    return ("/" in name and not name.startswith((".", "/", "~")) and not os.path.exists(name)
            and name.count("/") == 1)


def _download(repo_id: str, progress: Progress) -> None:
    """Fetch the files the loader needs into the HF cache (runner/hub_client.py), reporting
    bytes done. A failure is not fatal here: the loader then explains what it tried (cache,
    bundled copy). The download is not part of the load's fraction: it says its own."""
    from localpaged.runner import hub_client
    if hub_client.offline():
        return
    progress("downloading", "contacting the Hub")
    job = hub_client.start_download(repo_id)
    while not job.done.wait(0.25):
        progress("downloading", download_text(job))
    if job.error:
        log.info("%s; the loader tries the cache next", job.error)
