"""Shared by the chat-app controller tests of the context features: a LocalChatBackend on a tiny
model with the fallback chat template, a ChatController on a fresh store, and `run`."""

from __future__ import annotations

from localpaged import LLM
from localpaged.chat.backend import LocalChatBackend
from localpaged.engine.async_engine import AsyncEngine
from localpaged.ui.controller import ChatController
from localpaged.ui.models import FALLBACK_CHAT_TEMPLATE
from localpaged.ui.store import Store


class TinyBackend(LocalChatBackend):
    """The local backend over an in-process engine, keeping the test's handle on its LLMEngine
    (tests/helpers/step_gate.py holds that engine's thread in a step)."""

    def __init__(self, llm_engine) -> None:
        super().__init__(AsyncEngine(llm_engine))
        self.llm_engine = llm_engine


def tiny_backend(path: str, backend_class: type | None = None, **llm_kwargs):
    """Yields a TinyBackend (or `backend_class`, a subclass) on the model at path (a generator
    for a pytest fixture)."""
    llm = LLM(path, **llm_kwargs)
    llm.tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    backend = (backend_class or TinyBackend)(llm.engine)
    yield backend
    backend.engine.shutdown()


def controller(backend, tmp_path, sampling: dict):
    """Yields a ChatController on a new store in tmp_path; stops its turns afterwards (a
    generator: `yield from` it in a fixture, or wrap it in contextlib.contextmanager)."""
    store = Store(tmp_path / "conversations.db")
    c = ChatController(store, lambda: backend, sampling, tmp_path / "ui_state.json")
    try:
        yield c
    finally:
        c.stop_all(wait=10)
        store.close()


def run(turn, timeout=60):
    assert turn.wait(timeout), "generation did not finish"
    assert turn.error is None, turn.error
    return turn


class RecordingBackend(TinyBackend):
    """TinyBackend keeping what each `chat` request sent: `sent[k]` is (messages, [params])."""

    def __init__(self, llm_engine) -> None:
        super().__init__(llm_engine)
        self.sent: list[tuple[list[dict], list]] = []

    def chat(self, messages, params, **kw):
        self.sent.append(([dict(m) for m in messages],
                          list(params) if isinstance(params, list) else [params]))
        return super().chat(messages, params, **kw)


def recording_backend(path: str, **llm_kwargs):
    """Yields a RecordingBackend on the model at path (a generator for a pytest fixture)."""
    yield from tiny_backend(path, RecordingBackend, **llm_kwargs)
