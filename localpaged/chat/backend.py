"""ChatBackend: what the chat UI needs from an engine, local or remote.

The UI speaks only this interface: chat messages in, a stream of RequestOutput out (one output
per column), plus engine stats when the engine is local. `LocalChatBackend` wraps the in-process
AsyncEngine; `localpaged.chat.remote.RemoteChatBackend` talks to any OpenAI-compatible server.
What needs the engine itself (request priorities, beam search, a prefix-cache preview) is only
on `LocalChatBackend`: the UI checks `is_local(backend)` before it offers it.
Only a local backend knows its tokenizer, so only it offers `context_window()` (exact counts,
fitting a chat into the context limit), `submit_ids` (Continue from stored token ids) and
`decode`; the UI treats their absence as "unknown" (no gauge, no Continue).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from localpaged.chat.context_window import ContextWindow
from localpaged.core.request import BeamParams
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.async_engine import AsyncEngine
from localpaged.engine.llm import apply_chat_template
from localpaged.engine.outputs import EngineStats, RequestOutput


class ChatBackend(Protocol):
    model_name: str
    supports_kv_stats: bool

    def chat(self, messages: list[dict], params: list[SamplingParams],
             request_id: str | None = None) -> Iterator[RequestOutput]:
        """Stream one reply per entry of params (cumulative outputs[i].text); raises ValueError
        for bad input before streaming. Closing the iterator early cancels the request."""

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats | None: ...

    def prompt_blocks(self, messages: list[dict]) -> list[int]:
        """Cached KV block ids holding a prefix of this conversation's prompt (empty if remote)."""


class LocalChatBackend:
    supports_kv_stats = True

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        # The name the user asked for (what API clients send back), not the resolved source:
        # the offline fallback to the bundled GGUF is still "HuggingFaceTB/SmolLM2-135M-Instruct".
        self.model_name = engine.info.model
        # One window for the backend's life: its piece-count cache makes the gauge cheap.
        self._window = ContextWindow(engine.tokenizer, engine.context_limit())

    def context_window(self) -> ContextWindow:
        """The context limit (prompt + reply, LLMEngine.context_limit) with exact counts."""
        return self._window

    def submit_ids(self, token_ids: list[int], params: SamplingParams,
                   request_id: str | None = None) -> Iterator[RequestOutput]:
        """Stream one reply to a prompt given as token ids (Continue)."""
        return iter(self.engine.submit(list(token_ids), params, request_id))

    def decode(self, token_ids: list[int]) -> str:
        return self.engine.tokenizer.decode(token_ids, skip_special_tokens=True)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return apply_chat_template(self.engine.tokenizer, messages)

    def chat(self, messages: list[dict], params: list[SamplingParams],
             request_id: str | None = None,
             priority: str | None = None) -> Iterator[RequestOutput]:
        """priority: "interactive" (default) or "background" (see localpaged/core/scheduler.py)."""
        ids = self.prompt_ids(messages)
        if len(params) == 1:
            return iter(self.engine.submit(ids, params[0], request_id, priority=priority))
        return iter(self.engine.submit(ids, None, request_id, column_params=params,
                                       priority=priority))

    def beam_search(self, messages: list[dict], beam_width: int, max_tokens: int,
                    request_id: str | None = None) -> Iterator[RequestOutput]:
        """Stream a beam search over the chat prompt, as `LLM.beam_search` runs it (length
        penalty 1, transformers' heuristic stopping): the running beams while it runs, then the
        `beam_width` hypotheses, best first, each score in `cumulative_logprob`."""
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        return iter(self.engine.submit(self.prompt_ids(messages), params, request_id,
                                       beam=BeamParams(beam_width, 1.0, False)))

    def cached_prefix_tokens(self, messages: list[dict]) -> tuple[int, int]:
        """(prompt tokens a request for this conversation would reuse from the prefix cache
        now, prompt tokens in all); a preview: the cache may change before it is admitted."""
        ids = self.prompt_ids(messages)
        return self.engine.cached_prefix_tokens(ids), len(ids)

    def prefetch(self, messages: list[dict]) -> None:
        """Start reading this conversation's KV blocks back from the disk tier in the
        background (AsyncEngine.prefetch), so its next send finds them in memory."""
        if messages:
            self.engine.prefetch(self.prompt_ids(messages))

    def clear_kv_disk(self) -> None:
        """Empty the KV disk tier (AsyncEngine.clear_kv_disk)."""
        self.engine.clear_kv_disk()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def prompt_blocks(self, messages: list[dict]) -> list[int]:
        return self.cached_blocks(self.prompt_ids(messages))

    def cached_blocks(self, token_ids: list[int]) -> list[int]:
        """Cached KV block ids holding a prefix of these prompt token ids."""
        return self.engine.cached_prefix_blocks(token_ids)


def is_local(backend: ChatBackend | None) -> bool:
    """Whether the backend is the in-process engine (priorities, beams, prefix-cache preview)."""
    return isinstance(backend, LocalChatBackend)
