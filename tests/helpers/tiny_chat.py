"""A chat controller over a tiny random model in an in-process engine, for the UI feature tests
(background alternatives, beams in Compare, the edit cost preview). Greedy settings, so every
reply is deterministic; `poll` waits for a condition with a deadline (never a fixed sleep)."""

from __future__ import annotations

import time
from contextlib import contextmanager

from helpers import ui_helpers
from helpers.tiny_models import build
from helpers.ui_helpers import run  # noqa: F401 (shared with the tests importing it from here)

from localpaged import LLM
from localpaged.ui.models import FALLBACK_CHAT_TEMPLATE

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 24}
# The tiny tokenizer knows characters U+0100..U+02FC (ASCII maps to one unknown id).
P1, P2 = "ĀāĂăĄąĆćĈĉĊċČčĎďĐđĒēĔĕĖėĘęĚěĜĝĞğ" * 2, "ƀƁƂƃƄƅƆƇƈƉƊƋƌƍƎƏ" * 3


class CountingBackend(ui_helpers.TinyBackend):
    """The local backend, counting the requests the UI sends it."""

    def __init__(self, llm_engine) -> None:
        super().__init__(llm_engine)
        self.requests: list[str] = []

    def chat(self, messages, params, request_id=None, priority=None):
        self.requests.append(priority or "interactive")
        return super().chat(messages, params, request_id, priority)

    def beam_search(self, messages, beam_width, max_tokens, request_id=None):
        self.requests.append("beam")
        return super().beam_search(messages, beam_width, max_tokens, request_id)


def tiny_llm(root: str) -> LLM:
    llm = LLM(build("llama-gqa", root), num_kv_blocks=256)
    llm.tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    return llm


@contextmanager
def engine_backend(root: str):
    backend = CountingBackend(tiny_llm(root).engine)
    try:
        yield backend
    finally:
        backend.engine.shutdown()


@contextmanager
def controller(backend, tmp_path, sampling=None):
    yield from ui_helpers.controller(backend, tmp_path, sampling or GREEDY)


def poll(condition, timeout=60.0, what="condition"):
    """The condition's first truthy value, checked until the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")
