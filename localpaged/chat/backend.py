"""ChatBackend: what the chat UI needs from an engine, local or remote.

The UI speaks only this interface: chat messages in, a stream of RequestOutput out (one output
per column), plus engine stats when the engine is local. `LocalChatBackend` wraps the in-process
AsyncEngine; `localpaged.chat.remote.RemoteChatBackend` talks to any OpenAI-compatible server.
What needs the engine itself (request priorities, beam search, a prefix-cache preview) is only
on `LocalChatBackend`: the UI checks `is_local(backend)` before it offers it.
Only a local backend knows its tokenizer, so only it offers `context_window()` (exact counts,
fitting a chat into the context limit), `submit_ids` (Continue from stored token ids) and
`decode`; the UI treats their absence as "unknown" (no gauge, no Continue).
Tools: `chat(..., tools=[ToolSpec], tool_choice=...)` offers them to the model and
`parse_reply(text)` splits a finished reply into its text and its calls (chat/tool_calls.py).
Reasoning: a local backend gives every request its model's reasoning markers, so the params'
`reasoning_budget` holds, and `reasoning_format()` splits a reply's reasoning from its answer
(chat/reasoning.py); `reasoning_of(backend)` is None for a backend without one (remote).
A local backend renders the tools through the model's template family and holds the calls to
their schemas with a grammar; a remote one lets the server do both (remote.py).
Images: a chat whose messages carry image parts (chat/images.py) is sent by a local backend as
the model's processor makes its prompt (an engine ImagePrompt; `image_prompt(messages)`), and
counted so by its context window; a model that takes no images refuses it (ValueError), and so
does a remote backend: images the user attaches are never sent anywhere.
Template switches: `with_thinking(backend, enabled)` is the backend whose every prompt (the
request's, the context window's counts, the prefix-cache previews) passes `enable_thinking` to
the chat template, where the model's template reads it (ReasoningFormat.has_switch); any other
backend is returned as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace
from typing import Protocol

from localpaged.chat.context_window import ContextWindow
from localpaged.chat.images import ImageWindow, has_images
from localpaged.chat.reasoning import ReasoningFormat, reasoning_format
from localpaged.chat.tool_calls import (
    ParsedReply,
    ToolFormat,
    ToolSpec,
    normalize_choice,
    prompt_messages,
    tool_format,
)
from localpaged.core.request import BeamParams
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.async_engine import AsyncEngine
from localpaged.engine.detokenizer import decode
from localpaged.engine.multimodal import ImagePrompt
from localpaged.engine.outputs import EngineStats, RequestOutput


class ChatBackend(Protocol):
    model_name: str
    supports_kv_stats: bool

    def chat(self, messages: list[dict], params: list[SamplingParams],
             request_id: str | None = None, *, tools: list[ToolSpec] | None = None,
             tool_choice="auto") -> Iterator[RequestOutput]:
        """Stream one reply per entry of params (cumulative outputs[i].text); raises ValueError
        for bad input before streaming. Closing the iterator early cancels the request.
        `tools` are offered to the model (tool_choice: "auto", "none", "required" or a tool's
        name); messages may hold assistant `tool_calls` and `role: "tool"` results."""

    def parse_reply(self, text: str) -> ParsedReply:
        """A reply's text and tool calls, as the model of this backend writes them."""

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats | None: ...

    def prompt_blocks(self, messages: list[dict]) -> list[int]:
        """Cached KV block ids holding a prefix of this conversation's prompt (empty if remote)."""


# The top alternatives the engine reports for every token of a chat reply (kept by the app, so
# a reply can be branched at any token with another choice).
ALTERNATIVES = 5


class LocalChatBackend:
    supports_kv_stats = True

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        # The name the user asked for (what API clients send back), not the resolved source:
        # the offline fallback to the bundled GGUF is still "HuggingFaceTB/SmolLM2-135M-Instruct".
        self.model_name = engine.info.model
        # One window for the backend's life: its piece-count cache makes the gauge cheap.
        self._window = ImageWindow(engine.tokenizer, engine.context_limit(),
                                   engine.image_prompt if engine.takes_images else None,
                                   self.model_name)

    @property
    def template_kwargs(self) -> dict:
        """What this backend passes to the chat template besides the messages."""
        return self._window.template_kwargs

    def with_template_kwargs(self, **kwargs) -> "LocalChatBackend":
        """This backend (the same engine and piece counts) with these template arguments."""
        view = copy.copy(self)
        view._window = self._window.with_template_kwargs({**self.template_kwargs, **kwargs})
        return view

    def context_window(self) -> ContextWindow:
        """The context limit (prompt + reply, LLMEngine.context_limit) with exact counts."""
        return self._window

    def submit_ids(self, token_ids: list[int], params: SamplingParams,
                   request_id: str | None = None,
                   images: ImagePrompt | None = None) -> Iterator[RequestOutput]:
        """Stream one reply to a prompt given as token ids (Continue); `images`: the prompt
        with images those ids extend (a reply's own tokens after it), whose images they keep."""
        prompt: list[int] | ImagePrompt = list(token_ids)
        if images is not None:
            if prompt[:len(images.token_ids)] != list(images.token_ids):
                raise ValueError("the token ids do not extend the prompt with images")
            prompt = ImagePrompt(prompt, images.images, images.text)
        return iter(self.engine.submit(prompt, self._local([params])[0], request_id))

    def decode(self, token_ids: list[int]) -> str:
        """A reply's text as the engine streams it (its reasoning markers kept: detokenizer.py)."""
        fmt = self.reasoning_format()
        return decode(self.engine.tokenizer, token_ids, fmt.markers.special if fmt else ())

    def prompt_ids(self, messages: list[dict], tools: list[ToolSpec] | None = None,
                   tool_choice="auto") -> list[int]:
        """The prompt of a chat; tool calls, results and offered tools go through the model's
        template family (tool_calls.prompt_messages); a chat with images, its ImagePrompt's ids
        (a request sends the ImagePrompt: `image_prompt`)."""
        if has_images(messages):
            if tools:
                raise ValueError("tools cannot be offered in a conversation with images")
            return self._window.token_ids(messages)
        if not tools and not any(m.get("tool_calls") or m.get("role") == "tool"
                                 for m in messages):
            return self._window.token_ids(messages)
        offered = tools if normalize_choice(tool_choice, tools).mode != "none" else None
        msgs, kwargs = prompt_messages(messages, offered, self.tool_format())
        return list(self.engine.tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=False,
            **{**self.template_kwargs, **kwargs}))

    def image_prompt(self, messages: list[dict]) -> ImagePrompt | None:
        """The engine prompt of a chat with images (None without images); ValueError for a
        model that takes no images."""
        return self._window.image_prompt(messages) if has_images(messages) else None

    def request_prompt(self, messages: list[dict]) -> list[int] | ImagePrompt:
        """The engine prompt a reply to this chat sends: its ImagePrompt where it has images,
        else its token ids (the previews look blocks up with it too)."""
        return self.image_prompt(messages) or self.prompt_ids(messages)

    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls (read from its chat template at each call: the UI
        may set a template on a model that has none)."""
        return tool_format(self.engine.tokenizer.chat_template)

    def parse_reply(self, text: str) -> ParsedReply:
        return self.tool_format().parse(text)

    def reasoning_format(self) -> ReasoningFormat | None:
        """How this model marks its reasoning (read from its template at each call, as
        tool_format)."""
        return reasoning_format(self.engine.tokenizer)

    def _local(self, params: list[SamplingParams]) -> list[SamplingParams]:
        """What every reply of this backend asks the engine besides the user's settings: the
        top ALTERNATIVES of each token, and the model's reasoning markers."""
        fmt = self.reasoning_format()
        markers = {} if fmt is None else {"reasoning_markers": fmt.markers}
        return [replace(p, logprobs=max(p.logprobs or 0, ALTERNATIVES), **markers) for p in params]

    def chat(self, messages: list[dict], params: list[SamplingParams],
             request_id: str | None = None,
             priority: str | None = None, *, tools: list[ToolSpec] | None = None,
             tool_choice="auto") -> Iterator[RequestOutput]:
        """priority: "interactive" (default) or "background" (see localpaged/core/scheduler.py).
        With tools, every column's reply is held to the calls' grammar (ToolFormat.guided), so a
        column may not carry a guided constraint of its own."""
        ids = self.prompt_ids(messages, tools, tool_choice) if tools else \
            self.request_prompt(messages)
        fmt = self.tool_format()
        guided = fmt.guided(tools, tool_choice)
        if guided is not None:
            if any(p.guided is not None for p in params):
                raise ValueError("a reply with tools cannot also follow another output "
                                 "constraint (SamplingParams.guided)")
            markers = fmt.marker_ids(self.engine.tokenizer)      # the parser reads them
            params = [replace(p, guided=guided, text_special_tokens=markers) for p in params]
        params = self._local(params)
        if len(params) == 1:
            return iter(self.engine.submit(ids, params[0], request_id, priority=priority))
        return iter(self.engine.submit(ids, None, request_id, column_params=params,
                                       priority=priority))

    def beam_search(self, messages: list[dict], beam_width: int, max_tokens: int,
                    request_id: str | None = None) -> Iterator[RequestOutput]:
        """Stream a beam search over the chat prompt, as `LLM.beam_search` runs it (length
        penalty 1, transformers' heuristic stopping): the running beams while it runs, then the
        `beam_width` hypotheses, best first, each score in `cumulative_logprob`."""
        fmt = self.reasoning_format()
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                reasoning_markers=fmt.markers if fmt else None)
        return iter(self.engine.submit(self.request_prompt(messages), params, request_id,
                                       beam=BeamParams(beam_width, 1.0, False)))

    def cached_prefix_tokens(self, messages: list[dict]) -> tuple[int, int]:
        """(prompt tokens a request for this conversation would reuse from the prefix cache
        now, prompt tokens in all); a preview: the cache may change before it is admitted.
        A conversation with images is looked up as its request is (its ImagePrompt)."""
        prompt = self.request_prompt(messages)
        ids = prompt.token_ids if isinstance(prompt, ImagePrompt) else prompt
        return self.engine.cached_prefix_tokens(prompt), len(ids)

    def prefetch(self, messages: list[dict]) -> None:
        """Start reading this conversation's KV blocks back from the disk tier in the
        background (AsyncEngine.prefetch), so its next send finds them in memory."""
        if messages:
            self.engine.prefetch(self.request_prompt(messages))

    def clear_kv_disk(self) -> None:
        """Empty the KV disk tier (AsyncEngine.clear_kv_disk)."""
        self.engine.clear_kv_disk()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def prompt_blocks(self, messages: list[dict]) -> list[int]:
        return self.cached_blocks(self.request_prompt(messages))

    def cached_blocks(self, prompt: list[int] | ImagePrompt) -> list[int]:
        """Cached KV block ids holding a prefix of this prompt (token ids, or an ImagePrompt)."""
        return self.engine.cached_prefix_blocks(prompt)


def reasoning_of(backend: ChatBackend | None) -> ReasoningFormat | None:
    """The backend's model's reasoning format; None where it has none or cannot say."""
    get = getattr(backend, "reasoning_format", None)
    return get() if get is not None else None


def with_thinking(backend: ChatBackend | None, enabled: bool) -> ChatBackend | None:
    """The backend whose prompts ask the template for reasoning or not, where the model's
    template can switch it (else the backend as it is)."""
    fmt = reasoning_of(backend)
    if fmt is None or not fmt.has_switch or not isinstance(backend, LocalChatBackend):
        return backend
    return backend.with_template_kwargs(enable_thinking=enabled)


def is_local(backend: ChatBackend | None) -> bool:
    """Whether the backend is the in-process engine (priorities, beams, prefix-cache preview)."""
    return isinstance(backend, LocalChatBackend)
