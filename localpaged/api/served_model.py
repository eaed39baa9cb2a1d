"""ServedModel: the engine the API serves and the name it serves it under, swappable while the
server runs (the chat UI's model picker moves the API along with the chat).

    served = ServedModel(engine, "SmolLM2-135M-Instruct")
    app.include_router(create_api(served))
    served.swap(new_engine, "Qwen2.5-0.5B-Instruct")    # new requests go to new_engine

A request reads `current()` once and runs wholly on that `Model` (engine, tokenizer, name).
`swap` aborts the API requests still running on the old engine (their clients get
finish_reason "abort"), so its owner may shut it down; a request prepared on the old model but
not yet submitted gets a 503 asking to retry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from localpaged.api.errors import APIError
from localpaged.api.logprobs import TokenText
from localpaged.chat.reasoning import ReasoningFormat, reasoning_format
from localpaged.engine.async_engine import AsyncEngine, RequestStream


@dataclass(frozen=True, eq=False)
class Model:
    """One served model: its engine, its API name, when it started being served and how it
    marks its reasoning (chat/reasoning.py; None: it does not)."""
    engine: AsyncEngine
    name: str
    created: int = field(default_factory=lambda: int(time.time()))
    text_of: TokenText = field(init=False)
    reasoning: ReasoningFormat | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text_of", TokenText(self.engine.tokenizer))
        object.__setattr__(self, "reasoning", reasoning_format(self.engine.tokenizer))


class ServedModel:
    def __init__(self, engine: AsyncEngine, model_name: str) -> None:
        self._lock = threading.Lock()
        self._current = Model(engine, model_name)
        self._running: dict[RequestStream, Model] = {}

    def current(self) -> Model:
        return self._current

    @property
    def engine(self) -> AsyncEngine:
        return self._current.engine

    @property
    def model_name(self) -> str:
        return self._current.name

    def swap(self, engine: AsyncEngine, model_name: str) -> None:
        """Serve `engine` as `model_name` from now on; abort the requests on the old one."""
        new = Model(engine, model_name)
        with self._lock:
            old, self._current = self._current, new
            stale = [s for s, m in self._running.items() if m is old]
        for stream in stale:
            stream.cancel()

    def submit(self, model: Model, submit: Callable[[], RequestStream]) -> RequestStream:
        """Run `submit` (which queues a request on model.engine) if `model` is still served;
        the stream is aborted by a later swap until `release(stream)`."""
        with self._lock:
            if model is not self._current:
                raise APIError(f"The model was switched to '{self._current.name}' while this "
                               "request was being prepared; please retry.", 503,
                               "server_error", "model", "model_switched")
            stream = submit()
            self._running[stream] = model
        return stream

    def release(self, stream: RequestStream) -> None:
        with self._lock:
            self._running.pop(stream, None)


def as_served(engine: AsyncEngine | ServedModel, model_name: str | None = None) -> ServedModel:
    """A ServedModel as given, or one holding `engine` under `model_name`."""
    if isinstance(engine, ServedModel):
        if model_name is not None:
            raise TypeError("model_name comes from the ServedModel")
        return engine
    if model_name is None:
        raise TypeError("model_name is required with an AsyncEngine")
    return ServedModel(engine, model_name)
