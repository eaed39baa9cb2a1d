"""AsyncEngine: drives one LLMEngine from a background thread for many concurrent callers.

Callers (UI tabs, API clients) submit requests from any thread or event loop and iterate over
their own RequestStream, synchronously or with `async for`. While a long prompt is prefilled in
chunks, its stream gets outputs with no new text whose `num_computed_prompt_tokens` grows (the
prefill progress); the first token follows. Only the engine thread touches the
engine: submissions and aborts travel through a command queue and take effect between steps, so
every running request shares one batch. Validation (tokenizing, length checks) happens in the
caller's thread, so a bad request raises at once and disturbs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Iterator

from localpaged.core.request import BeamParams
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.llm_engine import LLMEngine
from localpaged.engine.outputs import EngineInfo, EngineStats, RequestOutput, StepRecord

logger = logging.getLogger(__name__)


class RequestStream:
    """The outputs of one request, in order; ends after the finished output."""

    def __init__(self, request_id: str, engine: "AsyncEngine",
                 loop: asyncio.AbstractEventLoop | None) -> None:
        self.request_id = request_id
        self._engine = engine
        self._loop = loop
        self._sync: queue.Queue = queue.Queue()
        self._async: asyncio.Queue | None = asyncio.Queue() if loop else None
        self.finished = False

    def put(self, item: RequestOutput | BaseException) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._async.put_nowait, item)
        else:
            self._sync.put(item)

    def cancel(self) -> None:
        if not self.finished:
            self._engine.abort(self.request_id)

    def _accept(self, item) -> RequestOutput:
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def __iter__(self) -> Iterator[RequestOutput]:
        try:
            while not self.finished:
                yield self._accept(self._sync.get())
        finally:
            self.cancel()                 # a consumer that stops early aborts its request

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                yield self._accept(await self._async.get())
        finally:
            self.cancel()


class AsyncEngine:
    """The engine's boundary for the UI and the API: submit / abort / stats / info, and read-only
    prefix-cache previews. The LLMEngine itself stays private to the engine thread."""

    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self.info: EngineInfo = engine.info()
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()          # guards _streams and the stats snapshot
        self._stats = engine.stats()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="localpaged-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self):
        return self._engine.tokenizer

    def context_limit(self) -> int:
        """The most tokens one request may hold, prompt plus reply (LLMEngine.context_limit)."""
        return self.info.context_limit

    # ---- callers ------------------------------------------------------------------------------
    def submit(self, prompt: str | list[int], params: SamplingParams | None = None,
               request_id: str | None = None,
               column_params: list[SamplingParams] | None = None,
               priority: str | None = None, beam: BeamParams | None = None) -> RequestStream:
        """Validate and queue a request; raises ValueError on bad input.

        With column_params, one output per entry, decoded together over the shared prompt.
        priority: "interactive" | "background" (default: params.priority); see scheduler.py.
        With beam, a beam search (the running beams stream, then the hypotheses, best first).
        """
        group = self._engine.make_group(prompt, params, request_id, beam=beam,
                                        column_params=column_params, priority=priority)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        stream = RequestStream(group.request_id, self, loop)
        with self._lock:
            if group.request_id in self._streams:
                raise ValueError(f"request id {group.request_id!r} is already running")
            self._streams[group.request_id] = stream
        self._commands.put(("add", group))
        return stream

    def generate(self, prompt, params=None, request_id=None) -> RequestStream:
        """Alias of submit: iterate the result with `for` or `async for`."""
        return self.submit(prompt, params, request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        """Tokens of this prompt in the prefix cache now (a preview: the engine thread may evict
        or add blocks before a request for it is admitted). Only dict lookups, so safe to call
        from any thread."""
        return self._engine.cached_prefix_tokens(token_ids)

    def cached_prefix_blocks(self, token_ids: list[int]) -> list[int]:
        """Ids of the cached blocks holding a prefix of these tokens now (the UI's KV map; a
        preview, like cached_prefix_tokens)."""
        return self._engine.cached_prefix_blocks(token_ids)

    def step_records(self) -> list[StepRecord]:
        """The engine's steps so far, oldest first: which requests ran together and how many
        tokens each computed (EngineConfig.record_steps; a RuntimeError when it is off). A
        step's record is kept before its outputs are delivered, so a caller that has seen an
        output also sees the step that made it."""
        records = self._engine.step_records
        if records is None:
            raise RuntimeError("step records are off: build the engine with record_steps=True")
        return list(records)          # a copy: the engine thread appends to the original

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step (never blocks on the engine)."""
        with self._lock:
            return self._stats

    def shutdown(self) -> None:
        self._stopped.set()
        self._commands.put(("stop", None))
        self._thread.join(timeout=10)

    # ---- the engine thread --------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._drain(block=not self._engine.has_unfinished_requests())
            if not self._engine.has_unfinished_requests():
                continue
            try:
                outputs = self._engine.step()
            except Exception as exc:  # noqa: BLE001 - fail every request, keep serving
                logger.exception("engine step failed")
                self._fail_all(exc)
                continue
            self._snapshot()                  # before delivering: a reader never sees older stats
            for out in outputs:
                self._deliver(out)

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(*cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
        self._snapshot()

    def _apply(self, kind: str, arg) -> None:
        if kind == "add":
            try:
                self._engine.add_group(arg)
            except ValueError as exc:
                self._deliver_error(arg.request_id, exc)
        elif kind == "abort":
            out = self._engine.abort(arg)
            if out is not None:
                self._deliver(out)

    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            stream = self._streams.pop(out.request_id, None) if out.finished \
                else self._streams.get(out.request_id)
        if stream is not None:
            stream.put(out)

    def _deliver_error(self, request_id: str, exc: BaseException) -> None:
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for request_id in list(self._engine.groups):
            self._engine.abort(request_id)
            self._deliver_error(request_id, RuntimeError(f"engine error: {exc}"))

    def _snapshot(self) -> None:
        stats = self._engine.stats(with_block_tables=True)
        with self._lock:
            self._stats = stats
