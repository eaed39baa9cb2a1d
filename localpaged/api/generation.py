"""Running one API request on the AsyncEngine: a whole response, or a stream of SSE chunks.

`Generation` wraps one engine RequestStream. `collect()` waits for the final output (aborting the
request if the client goes away meanwhile); `sse()` yields `data: {...}\\n\\n` chunks carrying
only what is new since the previous chunk, then `data: [DONE]\\n\\n`. `SSEResponse` makes sure the
engine request is aborted however the response ends (finished, client gone, server error).
A completion with echo puts the prompt (and its tokens' logprobs, the first null) before the
generated text, in the whole response or in each choice's first chunk. A chat that offered
tools renders its replies through tool_output.ToolReplies (message.tool_calls, call deltas).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from localpaged.api.errors import APIError
from localpaged.api.logprobs import (
    TokenText,
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
)
from localpaged.api.metrics import MetricsRecorder
from localpaged.api.prompt_bound import chars_of, check_fits, drop_turns_beyond
from localpaged.api.protocol import ChatCompletionRequest, Echo
from localpaged.api.reasoning_output import ReasoningReplies, reasoning_row, with_reasoning
from localpaged.api.tool_output import ToolReplies, chunk_rows
from localpaged.chat.context_window import (
    DEFAULT_REPLY_RESERVE,
    ContextOverflowError,
    ContextWindow,
)
from localpaged.core.request import TokenLogprob
from localpaged.engine.async_engine import RequestStream
from localpaged.engine.outputs import CompletionOutput, OutputAccumulator, RequestOutput

logger = logging.getLogger(__name__)

def chat_prompt(tokenizer, messages: list[dict], body: ChatCompletionRequest, limit: int,
                max_tokens: int | None, *,
                template_kwargs: dict | None = None) -> tuple[list[int], dict]:
    """The chat's prompt token ids, and the extension fields its response carries.

    Text that cannot fit is refused before the template or the tokenizer runs (prompt_bound.py).
    Without `context_overflow` the whole chat is sent (a chat that is too long is refused later,
    as before). With it, ContextWindow.fit keeps prompt + reply within `limit`: the reply's room
    is max_tokens, else min(DEFAULT_REPLY_RESERVE, limit // 4); "drop_oldest" leaves out the
    oldest whole turns and the response says how many messages (`dropped_messages`).
    `template_kwargs` go to the chat template (its `tools=`).
    """
    flags = dict(add_generation_prompt=body.add_generation_prompt is not False,
                 continue_final_message=bool(body.continue_final_message))
    window = ContextWindow(tokenizer, limit, template_kwargs=template_kwargs)
    if body.context_overflow is None:
        check_fits(tokenizer, chars_of(messages), limit, "The conversation", "messages")
        return window.token_ids(messages, **flags), {}
    reserve = max_tokens or min(DEFAULT_REPLY_RESERVE, limit // 4)
    if reserve >= limit:
        raise APIError(f"{body.max_tokens_param} is {reserve}; this model's context limit is "
                       f"{limit} tokens, prompt included.", param=body.max_tokens_param,
                       code="context_length_exceeded")
    cut = 0
    if body.context_overflow == "drop_oldest":
        messages, cut = drop_turns_beyond(tokenizer, messages, limit - reserve)
    check_fits(tokenizer, chars_of(messages), limit - reserve,
               "The conversation" if cut == 0 else "Its system prompt and latest turn",
               "messages")
    try:
        fit = window.fit(messages, reserve, body.context_overflow, **flags)
    except ContextOverflowError as exc:
        raise APIError(f"The conversation does not fit this model's context ({exc}).",
                       param="messages", code="context_length_exceeded") from exc
    return fit.token_ids, {"dropped_messages": cut + fit.num_dropped}



def pruned_field(o: CompletionOutput) -> dict:
    """{"pruned": {"at", "score", "best"}} for a choice parallel thinking pruned, else {}."""
    p = o.pruned
    return {} if p is None else {"pruned": {"at": p.at, "score": p.score, "best": p.best}}

def without_generation(out: RequestOutput) -> RequestOutput:
    """max_tokens=0 with echo: the engine sampled one token, the response shows none."""
    outputs = [replace(o, text="", token_ids=[], logprobs=[] if o.logprobs is not None else None,
                       finish_reason="length" if o.finish_reason else None, stop_reason=None,
                       cumulative_logprob=0.0)
               for o in out.outputs]
    return replace(out, outputs=outputs)


def usage(out: RequestOutput, completion: int | None = None, reasoning: bool = False) -> dict:
    """The usage object; `completion` tokens counted by the caller when out is a delta;
    `reasoning`: the model marks its reasoning, whose tokens are counted apart."""
    if completion is None:
        completion = sum(len(o.token_ids) for o in out.outputs)
    prompt = len(out.prompt_token_ids)
    body = {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": out.metrics.num_cached_tokens}}
    if reasoning:
        body["completion_tokens_details"] = {
            "reasoning_tokens": sum(o.reasoning_tokens for o in out.outputs)}
    return body


def _request_finish_reason(out: RequestOutput) -> str:
    reasons = {o.finish_reason for o in out.outputs}
    return next((r for r in ("abort", "length", "stop") if r in reasons), "stop")


class Generation:
    """One request on the engine, rendered as a chat or text completion."""

    def __init__(self, stream: RequestStream, kind: str, model: str, text_of: TokenText,
                 logprobs: bool, include_usage: bool, recorder: MetricsRecorder,
                 extensions: dict | None = None, echo: Echo | None = None,
                 tools: ToolReplies | None = None,
                 reasoning: ReasoningReplies | None = None,
                 prompt_ids: list[int] | None = None) -> None:
        self.stream, self.kind, self.model = stream, kind, model
        # return_token_ids (vLLM's): the prompt's ids, and each choice's, go with the response
        self.prompt_ids = prompt_ids
        self.token_ids = prompt_ids is not None
        self.id = stream.request_id
        self.created = int(time.time())
        self.text_of, self.logprobs, self.include_usage = text_of, logprobs, include_usage
        self.recorder = recorder
        self.echo = echo
        self.tools = tools
        self.reasoning = reasoning
        self.object = "chat.completion" if kind == "chat" else "text_completion"
        # Extension fields a request asked for (e.g. dropped_messages): on the response, and on
        # the first chunk of a stream; none unless asked, so OpenAI clients see no change.
        self.extensions = extensions or {}

    # ---- shared ----------------------------------------------------------------------------
    def _record(self, out: RequestOutput) -> None:
        try:
            self.recorder.record_request(out.metrics, _request_finish_reason(out),
                                         len(out.prompt_token_ids))
        except Exception:  # noqa: BLE001 - metrics never break a response
            logger.exception("recording metrics failed")

    def _logprobs_of(self, lps: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
        if not self.logprobs or lps is None:
            return None
        if self.kind == "chat":
            return chat_logprobs(self.text_of, lps)
        return completion_logprobs(self.text_of, lps, offset)

    # ---- whole response --------------------------------------------------------------------
    async def collect(self, request: Request | None = None) -> dict:
        watcher = asyncio.create_task(self._watch(request)) if request is not None else None
        total = OutputAccumulator(from_start=True)
        try:
            async for out in self.stream.deltas():
                total.add(out)
        except ValueError as exc:
            raise APIError(str(exc)) from exc
        except RuntimeError as exc:
            raise APIError(str(exc), 500, "server_error") from exc
        finally:
            if watcher is not None:
                watcher.cancel()
        final = total.output()
        self._record(final)
        if self.echo is not None and not self.echo.generate:
            final = without_generation(final)
        choices = [self._choice(o, final) for o in final.outputs]
        for choice, o in zip(choices, final.outputs):
            choice.update(pruned_field(o))
        ids = {}
        if self.token_ids:
            for choice, o in zip(choices, final.outputs):
                choice["token_ids"] = list(o.token_ids)
                if self.kind != "chat":
                    choice["prompt_token_ids"] = list(self.prompt_ids)
            if self.kind == "chat":
                ids["prompt_token_ids"] = list(self.prompt_ids)
        return {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model, "system_fingerprint": None, "choices": choices,
                "usage": usage(final, reasoning=self.reasoning is not None),
                **ids, **self.extensions}

    async def _watch(self, request: Request) -> None:
        """Abort the request when its client disconnects before the answer is ready."""
        while True:
            await asyncio.sleep(0.25)
            if await request.is_disconnected():
                logger.info("client of %s disconnected: aborting", self.id)
                self.stream.cancel()
                return

    def _choice(self, o: CompletionOutput, out: RequestOutput) -> dict:
        if self.echo is not None:
            return self._echo_choice(o, out)
        lps = self._logprobs_of(o.logprobs)
        if self.kind == "chat":
            split = self.reasoning.split(o.text) if self.reasoning is not None else None
            text = split.content if split is not None else o.text
            reason = o.finish_reason
            if self.tools is not None:
                message, called = self.tools.message(text)
                reason = "tool_calls" if called and reason == "stop" else reason
            else:
                message = {"role": "assistant", "content": text}
            if split is not None:
                message = with_reasoning(message, split)
            return {"index": o.index, "message": message, "logprobs": lps, "finish_reason": reason}
        return {"index": o.index, "text": o.text, "logprobs": lps,
                "finish_reason": o.finish_reason}

    def _echo_choice(self, o: CompletionOutput, out: RequestOutput) -> dict:
        prompt_text = self._echo_text(out)
        text, lps = self._with_echo(out, prompt_text, o.text,
                                    self._logprobs_of(o.logprobs, len(prompt_text)))
        return {"index": o.index, "text": text, "logprobs": lps, "finish_reason": o.finish_reason}

    def _echo_text(self, out: RequestOutput) -> str:
        p = self.echo.prompt
        return p if isinstance(p, str) else self.text_of.decode(out.prompt_token_ids)

    def _with_echo(self, out: RequestOutput, prompt_text: str, text: str,
                   lps: dict | None) -> tuple[str, dict | None]:
        """A choice's (first) text and logprobs with the prompt and its logprobs before them."""
        if self.logprobs and out.prompt_logprobs is not None:
            lps = echo_logprobs(self.text_of, out.prompt_token_ids, out.prompt_logprobs, lps)
        return prompt_text + text, lps

    # ---- streaming -------------------------------------------------------------------------
    def _chunk(self, choices: list[dict], usage_: dict | None = None,
               extensions: dict | None = None) -> str:
        body = {"id": self.id, "object": f"{self.object}.chunk" if self.kind == "chat"
                else self.object, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}
        if self.include_usage:
            body["usage"] = usage_
        body.update(extensions or {})
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    async def sse(self, n: int) -> AsyncIterator[str]:
        """The stream's deltas as chunks: a reader that fell behind gets fewer, larger ones."""
        sent_text = [0] * n
        sent_tokens = [0] * n
        done = [False] * n
        echoed = [self.echo is None] * n        # echo: the prompt goes first, once per choice
        prompt_text = ""
        ids: list[list[int] | None] = [None] * n    # token ids not yet sent (return_token_ids)
        prompt_ids_due = [self.token_ids and self.kind != "chat"] * n
        if self.kind == "chat":
            first = dict(self.extensions)
            if self.token_ids:
                first["prompt_token_ids"] = list(self.prompt_ids)
            yield self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None} for i in range(n)],
                              extensions=first)
        final: RequestOutput | None = None
        rows: list[dict] = []                   # tool replies: one choice entry per delta
        prompt_lps = None                       # a delta carries them only when they changed
        try:
            async for out in self.stream.deltas():
                prompt_lps = out.prompt_logprobs or prompt_lps
                out = replace(out, prompt_logprobs=prompt_lps)
                if self.echo is not None:
                    prompt_text = prompt_text or self._echo_text(out)
                    if not self.echo.generate:
                        out = without_generation(out)
                final = out
                choices = []
                for o in out.outputs:
                    i = o.index
                    delta = o.text
                    new_lps = (o.logprobs or []) if self.logprobs else []
                    newly_done = o.finish_reason is not None and not done[i]
                    if self.token_ids and o.token_ids:
                        ids[i] = (ids[i] or []) + list(o.token_ids)
                    if not (delta or new_lps or newly_done or not echoed[i]):
                        continue
                    lps = (self._logprobs_of(new_lps, len(prompt_text) + sent_text[i])
                           if self.logprobs else None)
                    if not echoed[i]:
                        delta, lps = self._with_echo(out, prompt_text, delta, lps)
                        echoed[i] = True
                    sent_text[i] += len(o.text)
                    sent_tokens[i] += len(o.token_ids)
                    done[i] = done[i] or newly_done
                    reason = o.finish_reason if newly_done else None
                    if self.kind == "chat":
                        new_rows = self._chat_rows(i, delta, newly_done, lps, reason)
                        rows.extend(new_rows)
                    else:
                        new_rows = [{"index": i, "text": delta, "logprobs": lps,
                                     "finish_reason": reason}]
                        if prompt_ids_due[i]:        # a completion's first chunk of choice i
                            new_rows[0]["prompt_token_ids"] = list(self.prompt_ids)
                            prompt_ids_due[i] = False
                        choices.extend(new_rows)
                    if newly_done and new_rows:
                        new_rows[-1].update(pruned_field(o))
                    if ids[i] is not None and new_rows:     # held text keeps its ids until sent
                        new_rows[-1]["token_ids"], ids[i] = ids[i], None
                if choices:
                    yield self._chunk(choices)
                for row in chunk_rows(rows):
                    yield self._chunk(row)
                rows.clear()
        except (ValueError, RuntimeError) as exc:
            kind = "invalid_request_error" if isinstance(exc, ValueError) else "server_error"
            yield f"data: {json.dumps(APIError(str(exc), type=kind).body())}\n\n"
            yield "data: [DONE]\n\n"
            return
        if final is not None:
            self._record(final)
            if self.include_usage:
                yield self._chunk([], usage(final, sum(sent_tokens), self.reasoning is not None))
        yield "data: [DONE]\n\n"

    def _chat_rows(self, i: int, text: str, done: bool, lps: dict | None,
                   reason: str | None) -> list[dict]:
        """Choice i's stream entries for its new text: the reasoning first (its own entry, so
        its own chunk), then the content (with tools: their deltas); logprobs and the finish
        reason on the last entry."""
        thought = ""
        if self.reasoning is not None:
            split = self.reasoning.feed(i, text, done)
            thought, text = split.reasoning, split.content
        if self.tools is not None:
            rows = self.tools.rows(i, text, done, lps, reason)
        elif text or lps or done:
            rows = [{"index": i, "delta": {"content": text} if text else {}, "logprobs": lps,
                     "finish_reason": reason}]
        else:
            rows = []
        if thought:
            rows.insert(0, reasoning_row(i, thought))
            if len(rows) == 1:
                rows[0]["logprobs"] = lps
        return rows


class SSEResponse(StreamingResponse):
    """A text/event-stream response that runs `on_close` however it ends.

    Starlette cancels the body iterator when the client disconnects, which aborts the engine
    request through RequestStream; `on_close` (the stream's cancel) also covers a body that was
    never started or a server that reports the disconnect only as a failed send.
    """

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:  # noqa: BLE001
                    logger.debug("closing the SSE body failed", exc_info=True)
            self._on_close()
