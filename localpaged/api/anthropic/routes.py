"""The Anthropic Messages routes, `POST /v1/messages` and `POST /v1/messages/count_tokens`, over
the same path as /v1/chat/completions: the request becomes OpenAI-shaped chat messages, tool
fields and a thinking budget (convert.py); the OpenAI routes' tool handling (structured.py)
shapes them for the model's template and gives the grammar of the calls; the chat template and
the same bounds make the prompt (generation.chat_prompt); the one AsyncEngine of the
ServedModel runs it. SSEResponse aborts the engine request however a stream ends; a whole
response aborts it when its client goes away. Nothing of the engine is held once a response
has ended, by error or not.

    app.include_router(create_messages_api(served, api_key, recorder, images))
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from types import SimpleNamespace

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from localpaged.api.anthropic import convert
from localpaged.api.anthropic.errors import error_body, route_class
from localpaged.api.anthropic.events import Reply, new_id, sse
from localpaged.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from localpaged.api.errors import APIError, from_value_error, model_not_found
from localpaged.api.generation import SSEResponse, chat_prompt
from localpaged.api.images import ImagePolicy, RequestImages
from localpaged.api.metrics import MetricsRecorder
from localpaged.api.routes import _check_limits
from localpaged.api.served_model import Model, ServedModel
from localpaged.api.structured import ToolRequest, tool_request
from localpaged.engine.async_engine import RequestStream
from localpaged.engine.grammar import GrammarError
from localpaged.engine.multimodal import ImagePrompt
from localpaged.engine.outputs import RequestOutput

logger = logging.getLogger(__name__)

ABORTED = ("The request was aborted before it finished (the model was switched or the server "
           "is stopping); please retry.")


def create_messages_api(served: ServedModel, api_key: str | None = None,
                        recorder: MetricsRecorder | None = None,
                        images: ImagePolicy | None = None) -> APIRouter:
    """The Anthropic Messages routes over what `served` serves; with `api_key`, each asks for
    it as `x-api-key` (or `Authorization: Bearer`); `images`: where image blocks' URLs may
    point (api/images.py; default: base64 sources only)."""
    api = _Messages(served, recorder or MetricsRecorder(), images or ImagePolicy())
    router = APIRouter(prefix="/v1", route_class=route_class(api_key), tags=["anthropic"])
    router.add_api_route("/messages", api.create, methods=["POST"])
    router.add_api_route("/messages/count_tokens", api.count_tokens, methods=["POST"])
    return router


@dataclass
class Prompt:
    """What the engine is sent for one request, the tools its reply may call and what its
    `thinking` asks (convert.thinking)."""
    ids: list[int]
    tools: ToolRequest
    thinking: convert.Thinking
    images: ImagePrompt | None = None     # what is submitted where the messages hold images


class _Messages:
    def __init__(self, served: ServedModel, recorder: MetricsRecorder,
                 images: ImagePolicy) -> None:
        self.served, self.recorder, self.images = served, recorder, images

    def _model(self, name: str) -> Model:
        model = self.served.current()
        if name != model.name:
            raise model_not_found(name, model.name)
        return model

    def _prompt(self, model: Model, body: CountTokensRequest) -> Prompt:
        """The prompt's token ids (run in a worker thread: the template and the tokenizer)."""
        tools = tool_request(convert.openai_tool_fields(body), model.engine.tokenizer)
        thinking = convert.thinking(body, model.reasoning)
        if convert.has_images(body):
            return self._image_prompt(model, body, tools, thinking)
        messages, template_kwargs = tools.prompt(convert.chat_messages(body))
        prefill = convert.prefills(messages)
        flags = SimpleNamespace(add_generation_prompt=not prefill, continue_final_message=prefill,
                                context_overflow=None, max_tokens_param="max_tokens")
        try:
            ids, _ = chat_prompt(model.engine.tokenizer, messages, flags,
                                 model.engine.context_limit(), getattr(body, "max_tokens", None),
                                 template_kwargs={**thinking.template_kwargs, **template_kwargs})
        except (jinja2.TemplateError, ValueError, TypeError) as exc:
            raise APIError(f"Could not apply the model's chat template: {exc}",
                           param="messages", code="invalid_messages") from exc
        return Prompt(ids, tools, thinking)

    def _image_prompt(self, model: Model, body: CountTokensRequest, tools: ToolRequest,
                      thinking: convert.Thinking) -> Prompt:
        """A prompt with images (the model's processor places them); tools and a prefilled
        reply are not combined with images, as on the OpenAI route."""
        if tools.active:
            raise APIError("'tools' is not supported in a request with images.", param="tools",
                           code="unsupported_parameter")
        images = RequestImages(self.images) if model.engine.takes_images else None
        messages = convert.chat_messages(body, images)     # no images taken: refused by name
        if convert.prefills(messages):
            raise APIError("A final assistant message (a prefilled reply) is not supported in a "
                           "request with images.", param="messages", code="unsupported_parameter")
        try:
            prompt = model.engine.image_prompt(messages, images.images,
                                               **thinking.template_kwargs)
        except (jinja2.TemplateError, ValueError, TypeError) as exc:
            raise APIError(f"Could not prepare the images for the model: {exc}",
                           param="messages", code="invalid_image") from exc
        return Prompt(list(prompt.token_ids), tools, thinking, prompt)

    async def count_tokens(self, body: CountTokensRequest) -> dict:
        prompt = await run_in_threadpool(self._prompt, self._model(body.model), body)
        return {"input_tokens": len(prompt.ids)}

    async def create(self, body: MessagesRequest, request: Request):
        model = self._model(body.model)
        try:
            params = convert.sampling_params(body)
        except ValueError as exc:
            raise from_value_error(exc, "messages") from exc
        prompt = await run_in_threadpool(self._prompt, model, body)
        _check_limits(model, prompt.ids, params, "max_tokens", "messages")
        params = prompt.tools.apply(params)
        if model.reasoning is not None:
            params = replace(params, reasoning_markers=model.reasoning.markers,
                             reasoning_budget=prompt.thinking.budget)
        message_id = new_id("msg")
        try:
            stream = self.served.submit(
                model, lambda: model.engine.submit(prompt.images or prompt.ids, params,
                                                   request_id=message_id))
        except GrammarError as exc:
            raise APIError(f"The tools' input_schema cannot be enforced: {exc}", param="tools",
                           code="invalid_value") from exc
        except ValueError as exc:
            raise from_value_error(exc, "messages") from exc
        reply = Reply(message_id, model.name, len(prompt.ids), body.stop_sequences,
                      prompt.tools.fmt if prompt.tools.active else None, bool(body.stream),
                      model.reasoning, prompt.ids)

        def close() -> None:
            stream.cancel()
            self.served.release(stream)

        if body.stream:
            return SSEResponse(self._events(stream, reply), on_close=close)
        try:
            await self._collect(stream, reply, request)
            return JSONResponse(reply.message())
        finally:
            close()

    # ---- running it ---------------------------------------------------------------------------
    def _record(self, out: RequestOutput | None) -> None:
        if out is None:
            return
        try:
            self.recorder.record_request(out.metrics, out.outputs[0].finish_reason,
                                         len(out.prompt_token_ids))
        except Exception:  # noqa: BLE001 - metrics never break a response
            logger.exception("recording metrics failed")

    async def _fed(self, stream: RequestStream, reply: Reply) -> AsyncIterator[list[dict]]:
        """The events each output adds to the reply, then those that end it; an engine error
        or an aborted request raises APIError."""
        last = None
        try:
            async for last in stream.deltas():
                yield reply.feed(last)
        except ValueError as exc:
            raise APIError(str(exc)) from exc
        except RuntimeError as exc:
            raise APIError(str(exc), 500, "server_error") from exc
        if reply.finish_reason == "abort":
            raise APIError(ABORTED, 503, "server_error", code="aborted")
        self._record(last)
        yield reply.finish()

    async def _collect(self, stream: RequestStream, reply: Reply, request: Request) -> None:
        """Feed the whole reply (aborting it if the client goes away first)."""
        watcher = asyncio.create_task(_abort_on_disconnect(request, stream))
        try:
            async for _ in self._fed(stream, reply):
                pass
        finally:
            watcher.cancel()

    async def _events(self, stream: RequestStream, reply: Reply) -> AsyncIterator[str]:
        for event in reply.start():
            yield sse(event)
        try:
            async for events in self._fed(stream, reply):
                for event in events:
                    yield sse(event)
        except APIError as exc:
            yield sse(error_body(exc.status, exc.message))


async def _abort_on_disconnect(request: Request, stream: RequestStream) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)
    logger.info("client of %s disconnected: aborting", stream.request_id)
    stream.cancel()
