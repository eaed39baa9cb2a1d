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
from contextlib import aclosing, closing

from localpaged.core.request import BeamParams
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.llm_engine import LLMEngine
from localpaged.engine.multimodal import ImagePrompt
from localpaged.engine.outputs import (
    DeltaCursor,
    EngineInfo,
    EngineStats,
    OutputAccumulator,
    RequestOutput,
    StepRecord,
)

logger = logging.getLogger(__name__)

PREFETCH_BLOCKS = 8        # blocks a prefetch reads between two engine steps


class RequestStream:
    """The outputs of one request, in order; ends after the finished output.

    `for out in stream` / `async for out in stream` yield full outputs (every token and the
    whole text so far); `stream.deltas()` yields deltas (only what is new, see outputs.py).
    Between the engine thread and the reader sits one buffer, not a queue: each output the
    engine delivers is added (as a delta) into it, and a read takes the whole buffer. A reader
    that falls behind (a client that stopped reading) so gets fewer, larger deltas; the buffer
    never holds more than the reply itself, whose tokens and logprobs the engine holds anyway.
    """

    def __init__(self, request_id: str, engine: "AsyncEngine",
                 loop: asyncio.AbstractEventLoop | None, full_outputs: bool = False) -> None:
        self.request_id = request_id
        self._engine = engine
        self._loop = loop
        # A beam search reorders its beams: it sends full outputs, each replacing the last.
        self._cursor = None if full_outputs else DeltaCursor()
        self._cond = threading.Condition()      # guards _pending and _error
        self._pending: OutputAccumulator | None = None
        self._error: BaseException | None = None
        self._wake = asyncio.Event() if loop else None
        self.finished = False

    # ---- the engine thread -------------------------------------------------------------------
    def put(self, item: RequestOutput | BaseException) -> None:
        with self._cond:
            if isinstance(item, BaseException):
                self._error = item
            else:
                self._pending = self._pending or OutputAccumulator()
                self._pending.add(self._cursor.delta(item) if self._cursor else item)
            self._cond.notify_all()
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:                  # the reader's event loop is gone
                pass

    # ---- the reader ------------------------------------------------------------------------
    def cancel(self) -> None:
        if not self.finished:
            self._engine.abort(self.request_id)

    def _take(self) -> RequestOutput | None:
        """Everything delivered since the last take, as one output; None when nothing was.
        Raises the request's error after its last output."""
        with self._cond:
            pending, self._pending = self._pending, None
            error = self._error if pending is None else None
        if error is not None:
            self.finished = True
            raise error
        if pending is None:
            return None
        out = pending.output()
        self.finished = out.finished
        return out

    def _next_sync(self) -> RequestOutput:
        with self._cond:
            self._cond.wait_for(lambda: self._pending is not None or self._error is not None)
        return self._take()

    async def _next_async(self) -> RequestOutput:
        while True:
            self._wake.clear()                    # before looking: a later put sets it again
            out = self._take()
            if out is not None:
                return out
            await self._wake.wait()

    def _sync_deltas(self) -> Iterator[RequestOutput]:
        try:
            while not self.finished:
                yield self._next_sync()
        finally:
            self.cancel()                 # a consumer that stops early aborts its request

    async def deltas(self) -> AsyncIterator[RequestOutput]:
        """The outputs as deltas (a full output where a beam search replaces its beams)."""
        try:
            while not self.finished:
                yield await self._next_async()
        finally:
            self.cancel()

    def __iter__(self) -> Iterator[RequestOutput]:
        total = OutputAccumulator(from_start=True)
        with closing(self._sync_deltas()) as deltas:      # closed (so cancelled) at once
            for out in deltas:
                total.add(out)
                yield total.output()

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        total = OutputAccumulator(from_start=True)
        async with aclosing(self.deltas()) as deltas:
            async for out in deltas:
                total.add(out)
                yield total.output()


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
        self._prefetch: list[int] | ImagePrompt | None = None   # engine thread: prompt read ahead
        self._thread = threading.Thread(target=self._loop, name="localpaged-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self):
        return self._engine.tokenizer

    def context_limit(self) -> int:
        """The most tokens one request may hold, prompt plus reply (LLMEngine.context_limit)."""
        return self.info.context_limit

    # ---- callers ------------------------------------------------------------------------------
    def submit(self, prompt: str | list[int] | ImagePrompt, params: SamplingParams | None = None,
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
        stream = RequestStream(group.request_id, self, loop, full_outputs=beam is not None)
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

    @property
    def takes_images(self) -> bool:
        """Whether prompts with images are served (a vision tower and its processor)."""
        return self._engine.images is not None

    def image_prompt(self, messages: list[dict], images: list, **template_kwargs) -> ImagePrompt:
        """Chat messages with {"type": "image"} parts and their images (PIL, in order) as a
        prompt for submit (engine/multimodal.py; reads no engine state: any thread). A
        ValueError for a model that takes no images or markers unlike the images."""
        if self._engine.images is None:
            raise ValueError("this model takes no images")
        return self._engine.images.chat(messages, images, **template_kwargs)

    def cached_prefix_tokens(self, prompt: list[int] | ImagePrompt) -> int:
        """Tokens of this prompt (token ids, or an ImagePrompt) in the prefix cache now (a
        preview: the engine thread may evict or add blocks before a request for it is
        admitted). Only dict lookups, so safe to call from any thread."""
        return self._engine.cached_prefix_tokens(prompt)

    def cached_prefix_blocks(self, prompt: list[int] | ImagePrompt) -> list[int]:
        """Ids of the cached blocks holding a prefix of this prompt now (the UI's KV map; a
        preview, like cached_prefix_tokens)."""
        return self._engine.cached_prefix_blocks(prompt)

    def prefetch(self, prompt: list[int] | ImagePrompt) -> None:
        """Start reading this prompt's blocks back from the disk tier into free KV blocks, at
        background priority: a few blocks between engine steps, while requests run (a
        conversation opened: its next send finds them in memory). A newer prefetch replaces
        an unfinished older one; a no-op without a disk tier."""
        if not isinstance(prompt, ImagePrompt):
            prompt = [int(t) for t in prompt]
        self._commands.put(("prefetch", prompt))

    def clear_kv_disk(self) -> None:
        """Delete every block file of the disk tier (memory's prefix cache stays)."""
        self._commands.put(("clear_kv_disk", None))

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
            self._drain(block=not self._engine.has_unfinished_requests() and self._prefetch is None)
            self._prefetch_some()
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
        elif kind == "prefetch":
            self._prefetch = arg
        elif kind == "clear_kv_disk":
            self._engine.clear_kv_disk()

    def _prefetch_some(self) -> None:
        """One slice of the pending prefetch (PREFETCH_BLOCKS blocks), between steps."""
        if self._prefetch is None:
            return
        try:
            read = self._engine.prefetch(self._prefetch, PREFETCH_BLOCKS)
        except Exception:  # noqa: BLE001 - a read ahead is only a hint; keep serving
            logger.exception("KV disk prefetch failed")
            read = 0
        if read == 0:
            self._prefetch = None
        self._snapshot()

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
