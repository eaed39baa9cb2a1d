"""RemoteChatBackend: the ChatBackend protocol over any OpenAI-compatible server.

The UI can talk to a localpaged server elsewhere (or vLLM, llama.cpp, Ollama, ...) exactly as it
talks to its in-process engine. One entry of `params` with n samples is one streaming request;
several entries (side-by-side columns) are one streaming request each, read concurrently by
worker threads and merged into RequestOutput objects with one CompletionOutput per column and
cumulative text. Closing the iterator (or `abort`) stops the readers, which close their HTTP
streams, so the server aborts the requests. A remote server shows no KV blocks: `stats()` is
None and `prompt_blocks()` is empty. Token ids are not sent over the API: `token_ids` stay empty
and `metrics.num_generated_tokens` counts streamed chunks until the final usage replaces it.
Tools go to the server as `tools` / `tool_choice`; the calls it streams back are written into
the reply's text in the hermes syntax (`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`,
the arguments as the server sent them), so the UI stores one text per reply and `parse_reply`
gives the calls back (tool_calls.py), with the server's own call ids replaced by new ones.
Images the user attached are never sent: a chat with image parts is refused (ValueError,
chat/images.py REMOTE_REFUSAL).
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import openai

from localpaged.chat.images import REMOTE_REFUSAL, has_images
from localpaged.chat.tool_calls import ParsedReply, ToolFormat, ToolSpec
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.outputs import (
    CompletionOutput,
    EngineStats,
    RequestMetrics,
    RequestOutput,
)

_ids = itertools.count()


def request_kwargs(p: SamplingParams) -> dict:
    """SamplingParams as chat.completions.create arguments (extensions via extra_body)."""
    kw: dict = {"temperature": p.temperature, "top_p": p.top_p, "n": p.n,
                "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty}
    if p.max_tokens is not None:
        kw["max_tokens"] = p.max_tokens
    if p.stop:
        kw["stop"] = list(p.stop)
    if p.seed is not None:
        kw["seed"] = p.seed
    if p.logprobs is not None:
        kw["logprobs"], kw["top_logprobs"] = True, p.logprobs
    extra = {k: v for k, v, default in (
        ("top_k", p.top_k, 0), ("min_p", p.min_p, 0.0),
        ("repetition_penalty", p.repetition_penalty, 1.0), ("ignore_eos", p.ignore_eos, False),
        ("stop_token_ids", p.stop_token_ids, [])) if v != default}
    if extra:
        kw["extra_body"] = extra
    return kw


class _Call:
    """The streams of one chat() call, their reader threads and the merged state."""

    def __init__(self, request_id: str, num_outputs: int) -> None:
        self.request_id = request_id
        self.events: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.streams: list = []
        self.threads: list[threading.Thread] = []
        self.outputs = [CompletionOutput(i, "", [], None) for i in range(num_outputs)]
        self.chunks = [0] * num_outputs
        self.arrival = time.monotonic()
        self.first_token: float | None = None
        self.usage: list = []
        self.calls: dict[int, _CallText] = {}     # output index -> its open tool call

    def read(self, stream, first_index: int) -> None:
        """Reader thread: push (index, delta, finish_reason) events; None when the stream ends."""
        try:
            for chunk in stream:
                if self.cancelled.is_set():
                    break
                if chunk.usage is not None:
                    self.usage.append((first_index, chunk.usage))
                for choice in chunk.choices:
                    index = first_index + choice.index
                    delta = choice.delta.content or "" if choice.delta else ""
                    calls = self.calls.setdefault(index, _CallText())
                    for tc in (choice.delta.tool_calls or []) if choice.delta else []:
                        delta += calls.add(tc)
                    if choice.finish_reason is not None:
                        delta += calls.close()
                    self.events.put((index, delta, choice.finish_reason))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            if not self.cancelled.is_set():
                self.events.put(exc)
        finally:
            try:
                stream.close()
            except Exception:  # noqa: BLE001
                pass
            self.events.put(None)

    def close(self) -> None:
        """Stop reading; each reader closes its own stream at its next chunk (httpx responses
        are not closed from another thread)."""
        self.cancelled.set()

    def apply(self, index: int, delta: str, finish: str | None) -> bool:
        if not 0 <= index < len(self.outputs):
            return False
        out = self.outputs[index]
        if delta:
            out.text += delta
            self.chunks[index] += 1
            self.first_token = self.first_token or time.monotonic()
        out.finish_reason = finish or out.finish_reason
        return bool(delta or finish)

    def output(self, finished: bool) -> RequestOutput:
        usage = dict(self.usage)                # first output index of a stream -> its usage
        generated = sum(u.completion_tokens for u in usage.values()) if finished and usage \
            else sum(self.chunks)
        # Each column's stream reuses the shared prompt on its own: report the hit once.
        cached = max((getattr(getattr(u, "prompt_tokens_details", None), "cached_tokens", 0) or 0
                      for u in usage.values()), default=0)
        now = time.monotonic()
        metrics = RequestMetrics(self.arrival, self.first_token, now if finished else None,
                                 cached, generated)
        per_column = finished and len(usage) == len(self.outputs)   # one stream per column
        outs = [CompletionOutput(o.index, o.text, [], o.finish_reason,
                                 num_tokens=usage[o.index].completion_tokens if per_column
                                 else self.chunks[o.index])
                for o in self.outputs]
        return RequestOutput(self.request_id, None, [], outs, finished, metrics)


class _CallText:
    """Tool-call deltas of one output as hermes-syntax text (see the module docstring)."""

    def __init__(self) -> None:
        self.open: int | None = None      # the call being written (its index in the stream)
        self.has_args = False

    def add(self, tc) -> str:
        fn = tc.function
        text = ""
        if self.open is None or tc.index != self.open:
            text += self.close() + f'\n<tool_call>\n{{"name": {_json(fn.name or "")}, "arguments": '
            self.open, self.has_args = tc.index, False
        if fn is not None and fn.arguments:
            text += fn.arguments
            self.has_args = True
        return text

    def close(self) -> str:
        if self.open is None:
            return ""
        text = ("" if self.has_args else "{}") + "}\n</tool_call>"
        self.open = None
        return text


def _json(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


class RemoteChatBackend:
    supports_kv_stats = False

    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None,
                 timeout: float = 600.0) -> None:
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "none",
                                    timeout=timeout, max_retries=0)
        self._calls: dict[str, _Call] = {}
        self._lock = threading.Lock()
        if model is None:
            try:
                models = self.client.models.list().data
            except openai.OpenAIError as exc:
                raise ValueError(f"cannot list the models served at {base_url}: {exc}") from exc
            if not models:
                raise ValueError(f"the server at {base_url} serves no model")
            model = models[0].id
        self.model_name = model

    def parse_reply(self, text: str) -> ParsedReply:
        """The reply's text and the calls the server made (written into it in hermes syntax)."""
        return ToolFormat("hermes").parse(text)

    def chat(self, messages: list[dict], params: list[SamplingParams],
             request_id: str | None = None, *, tools: list[ToolSpec] | None = None,
             tool_choice="auto") -> Iterator[RequestOutput]:
        """Open the streams now (a bad request raises ValueError here), then stream replies."""
        if not params:
            raise ValueError("params must not be empty")
        if has_images(messages):
            raise ValueError(REMOTE_REFUSAL)
        request_id = request_id or f"remote-{next(_ids)}"
        # One request with n samples, or one request per column.
        plan = [(params[0], 0)] if len(params) == 1 else \
            [(_single(p), i) for i, p in enumerate(params)]
        call = _Call(request_id, params[0].n if len(params) == 1 else len(params))
        try:
            for p, first_index in plan:
                stream = self.client.chat.completions.create(
                    model=self.model_name, messages=_plain(messages), stream=True,
                    stream_options={"include_usage": True}, **request_kwargs(p),
                    **_tool_kwargs(tools, tool_choice))
                call.streams.append(stream)
        except openai.APIStatusError as exc:
            _close_all(call.streams)
            if 400 <= exc.status_code < 500:
                raise ValueError(_message(exc)) from exc
            raise RuntimeError(f"remote server error: {_message(exc)}") from exc
        except openai.APIConnectionError as exc:
            _close_all(call.streams)
            raise RuntimeError(f"cannot reach the remote server: {exc}") from exc
        for stream, (_, first_index) in zip(call.streams, plan):
            t = threading.Thread(target=call.read, args=(stream, first_index), daemon=True,
                                 name=f"remote-{request_id}")
            t.start()
            call.threads.append(t)
        with self._lock:
            self._calls[request_id] = call
        return self._merge(call)

    def _merge(self, call: _Call) -> Iterator[RequestOutput]:
        open_streams = len(call.streams)
        try:
            while open_streams and not call.cancelled.is_set():
                changed = False
                for event in _drain(call.events):
                    if event is None:
                        open_streams -= 1
                    elif isinstance(event, Exception):
                        raise RuntimeError(f"remote stream failed: {event}") from event
                    else:
                        changed = call.apply(*event) or changed
                if changed and open_streams and not call.cancelled.is_set():
                    yield call.output(False)
            for out in call.outputs:
                out.finish_reason = out.finish_reason or "abort"
            yield call.output(True)
        finally:
            call.close()
            with self._lock:
                self._calls.pop(call.request_id, None)

    def abort(self, request_id: str) -> None:
        with self._lock:
            call = self._calls.get(request_id)
        if call is not None:
            call.close()
            call.events.put((-1, "", None))     # an out-of-range index: wakes the consumer

    def stats(self) -> EngineStats | None:
        return None

    def prompt_blocks(self, messages: list[dict]) -> list[int]:
        return []


def _close_all(streams: list) -> None:
    """Close streams that no reader thread owns yet (an earlier column's, when a later failed)."""
    for stream in streams:
        try:
            stream.close()
        except Exception:  # noqa: BLE001
            pass


def _drain(events: queue.Queue) -> list:
    """The next event (waiting for it) and every other one already queued."""
    items = [events.get()]
    while True:
        try:
            items.append(events.get_nowait())
        except queue.Empty:
            return items


def _single(p: SamplingParams) -> SamplingParams:
    """A column is one output, whatever its n."""
    return p if p.n == 1 else replace(p, n=1)


def _plain(messages: list[dict]) -> list[dict]:
    """Messages with text content (Gradio's list-of-blocks content flattened), and their tool
    calls and the ids tool results answer."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content
                              if isinstance(b, dict) and b.get("type", "text") == "text")
        msg = {"role": m["role"], "content": content or ""}
        for key in ("tool_calls", "tool_call_id"):
            if m.get(key):
                msg[key] = m[key]
        out.append(msg)
    return out


def _tool_kwargs(tools: list[ToolSpec] | None, tool_choice) -> dict:
    """tools and tool_choice as chat.completions.create arguments (none without tools)."""
    if not tools:
        return {}
    if tool_choice not in ("auto", "none", "required") and isinstance(tool_choice, str):
        tool_choice = {"type": "function", "function": {"name": tool_choice}}
    return {"tools": [t.openai() for t in tools], "tool_choice": tool_choice}


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    err = body.get("error", body) if isinstance(body, dict) else {}
    return (err.get("message") if isinstance(err, dict) else None) or str(exc)

