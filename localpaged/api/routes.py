"""The OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /metrics.

`create_api` returns an APIRouter for any FastAPI app; include it before mounting Gradio at "/".
Requests from every client go to the one AsyncEngine, so they share its batches. The engine is
read from a `ServedModel` at each request, so the UI can switch the model under a running server.
Tokenizing and the chat template run in a worker thread, after a cheap bound on the prompt's
length (prompt_bound.py) and under no shared lock; the engine request is created in the event loop.
Output constraints and tools (structured.py) become SamplingParams.guided; the engine compiles
the grammar when the request is made, and a grammar it cannot compile is a 400 naming the
parameter that asked for it, before anything of the engine is held.
"""

from __future__ import annotations

import uuid

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from localpaged.api.errors import (
    APIError,
    from_value_error,
    model_not_found,
    route_class,
)
from localpaged.api.images import ImagePolicy, chat_images
from localpaged.api.metrics import CONTENT_TYPE, MetricsRecorder
from localpaged.api.prompt_bound import check_fits
from localpaged.api.protocol import ChatCompletionRequest, CompletionRequest
from localpaged.api.served_model import Model, ServedModel, as_served
from localpaged.api.generation import Generation, SSEResponse, chat_prompt
from localpaged.api.logprobs import TokenIdText
from localpaged.api.reasoning_output import ReasoningReplies, reasoning_request
from localpaged.api.structured import constrain, tool_request
from localpaged.api.tool_output import ToolReplies
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.async_engine import AsyncEngine
from localpaged.engine.multimodal import ImagePrompt


def create_api(engine: AsyncEngine | ServedModel, model_name: str | None = None,
               api_key: str | None = None, recorder: MetricsRecorder | None = None,
               images: ImagePolicy | None = None) -> APIRouter:
    """Routes of the OpenAI-compatible API over `engine`, serving it as `model_name`; or over
    whatever a ServedModel holds at each request (then `model_name` is not given).

    With `api_key`, every /v1 route requires `Authorization: Bearer <api_key>` (/metrics and
    /health stay open). Errors are OpenAI error objects with a 4xx status. /metrics serves
    `recorder` (a new one, this router's own, when not given). `images`: where image_url
    parts may come from (api/images.py; default: data: URLs only).
    """
    api = _API(as_served(engine, model_name), recorder or MetricsRecorder(), images or ImagePolicy())
    v1 = APIRouter(prefix="/v1", route_class=route_class(api_key), tags=["openai"])
    v1.add_api_route("/models", api.list_models, methods=["GET"])
    v1.add_api_route("/models/{model_id:path}", api.get_model, methods=["GET"])
    v1.add_api_route("/chat/completions", api.chat_completions, methods=["POST"])
    v1.add_api_route("/completions", api.completions, methods=["POST"])
    open_routes = APIRouter(route_class=route_class(None), tags=["monitoring"])
    open_routes.add_api_route("/metrics", api.metrics, methods=["GET"],
                              response_class=PlainTextResponse)
    open_routes.add_api_route("/health", api.health, methods=["GET"])
    router = APIRouter()
    router.include_router(v1)
    router.include_router(open_routes)
    return router


class _API:
    def __init__(self, served: ServedModel, recorder: MetricsRecorder, images: ImagePolicy) -> None:
        self.served = served
        self.recorder = recorder
        self.images = images
        # No lock around the tokenizer: HF fast tokenizers encode and decode from several threads
        # at once (the engine's detokenizer and the UI use the same one); only changing their
        # truncation or padding is unsafe beside a call, and nothing here asks for either.

    # ---- models, health, metrics ---------------------------------------------------------
    @staticmethod
    def _model_card(model: Model) -> dict:
        return {"id": model.name, "object": "model", "created": model.created,
                "owned_by": "localpaged", "max_model_len": model.engine.info.max_model_len}

    async def list_models(self) -> dict:
        return {"object": "list", "data": [self._model_card(self.served.current())]}

    async def get_model(self, model_id: str) -> dict:
        return self._model_card(self._check_model(model_id))

    async def health(self) -> dict:
        return {"status": "ok"}

    async def metrics(self) -> PlainTextResponse:
        return PlainTextResponse(self.recorder.render(self.served.engine.stats()),
                                 media_type=CONTENT_TYPE)

    def _check_model(self, name: str) -> Model:
        """The model now served, which the request must name; the request runs on it."""
        model = self.served.current()
        if name != model.name:
            raise model_not_found(name, model.name)
        return model

    # ---- generation ----------------------------------------------------------------------
    async def chat_completions(self, body: ChatCompletionRequest, request: Request):
        model = self._check_model(body.model)
        params = _params(body, "messages")
        tools = tool_request(body, model.engine.tokenizer)
        params, guided_param = constrain(params, body, tools)
        params, thinking_kwargs = reasoning_request(body, params, model.reasoning)
        if body.has_images():
            prompt = await run_in_threadpool(self._image_prompt, model, body, tools.active,
                                             thinking_kwargs)
            thoughts = ReasoningReplies(model.reasoning, params.n, prompt.token_ids) \
                if model.reasoning is not None else None
            return await self._generate(model, "chat", body, prompt.token_ids, params, request,
                                        "messages", None, guided_param, None, thoughts,
                                        prompt=prompt)
        messages, template_kwargs = tools.prompt(body.template_messages())
        body.check_template_flags()
        ids, extensions = await run_in_threadpool(self._chat_ids, model, messages, body,
                                                  params.max_tokens,
                                                  {**thinking_kwargs, **template_kwargs})
        replies = ToolReplies(tools.fmt, params.n) if tools.active else None
        thoughts = ReasoningReplies(model.reasoning, params.n, ids) \
            if model.reasoning is not None else None
        return await self._generate(model, "chat", body, ids, params, request, "messages",
                                    extensions, guided_param, replies, thoughts)

    async def completions(self, body: CompletionRequest, request: Request):
        model = self._check_model(body.model)
        params, guided_param = constrain(_params(body, "prompt"), body, None)
        prompt = body.prompt_value()
        if isinstance(prompt, str):
            if not prompt:
                raise APIError("prompt must not be empty.", param="prompt", code="invalid_value")
            check_fits(model.engine.tokenizer, len(prompt), model.engine.context_limit(),
                       "The prompt", "prompt")
            prompt = await run_in_threadpool(self._encode, model, prompt)
        return await self._generate(model, "completion", body, prompt, params, request, "prompt",
                                    guided_param=guided_param)

    def _chat_ids(self, model: Model, messages: list[dict], body: ChatCompletionRequest,
                  max_tokens: int | None, template_kwargs: dict) -> tuple[list[int], dict]:
        try:
            return chat_prompt(model.engine.tokenizer, messages, body,
                               model.engine.context_limit(), max_tokens,
                               template_kwargs=template_kwargs)
        except (jinja2.TemplateError, ValueError, TypeError) as exc:
            raise APIError(f"Could not apply the model's chat template: {exc}",
                           param="messages", code="invalid_messages") from exc

    def _image_prompt(self, model: Model, body: ChatCompletionRequest, with_tools: bool,
                      template_kwargs: dict) -> ImagePrompt:
        """The chat's prompt with its images (api/images.py reads them): refused, naming the
        first image part, where the model takes no images; tools and context_overflow are not
        combined with images."""
        first = next((f"messages[{i}].content[{j}]" for i, m in enumerate(body.messages)
                      if isinstance(m.content, list) for j, p in enumerate(m.content)
                      if p.type == "image_url"), "messages")
        if not model.engine.takes_images:
            raise APIError("This model takes no images (it is text-only, or its image "
                           "processor could not be loaded).", param=first,
                           code="unsupported_content")
        for flag, name in ((with_tools, "tools"), (body.context_overflow, "context_overflow"),
                           (body.continue_final_message, "continue_final_message")):
            if flag:
                raise APIError(f"'{name}' is not supported in a request with images.",
                               param=name, code="unsupported_parameter")
        messages, images = chat_images(body.messages, self.images)
        try:
            return model.engine.image_prompt(messages, images, **template_kwargs)
        except (jinja2.TemplateError, ValueError, TypeError) as exc:
            raise APIError(f"Could not prepare the images for the model: {exc}",
                           param=first, code="invalid_image") from exc

    def _encode(self, model: Model, text: str) -> list[int]:
        try:
            return list(model.engine.tokenizer.encode(text, add_special_tokens=True))
        except (ValueError, TypeError) as exc:
            raise APIError(f"Could not tokenize the prompt: {exc}", param="prompt",
                           code="invalid_value") from exc

    async def _generate(self, model: Model, kind: str,
                        body: ChatCompletionRequest | CompletionRequest, ids: list[int],
                        params: SamplingParams, request: Request, prompt_param: str,
                        extensions: dict | None = None, guided_param: str | None = None,
                        tools: ToolReplies | None = None,
                        reasoning: ReasoningReplies | None = None,
                        prompt: ImagePrompt | None = None):
        """`prompt`: a prompt with images whose token ids are `ids` (submitted instead)."""
        _check_limits(model, ids, params, body.max_tokens_param, prompt_param)
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            stream = self.served.submit(
                model, lambda: model.engine.submit(ids if prompt is None else prompt, params,
                                                   request_id=rid))
        except ValueError as exc:
            if params.guided is not None and params.guided.label in str(exc):
                raise APIError(f"Invalid '{guided_param}': {exc}", param=guided_param,
                               code="invalid_schema") from exc
            raise from_value_error(exc, prompt_param) from exc
        text_of = (TokenIdText(model.engine.tokenizer) if body.return_tokens_as_token_ids
                   else model.text_of)
        gen = Generation(stream, kind, model.name, text_of,
                         params.logprobs is not None, body.include_usage, self.recorder,
                         extensions, echo=body.echo_request(), tools=tools,
                         reasoning=reasoning, prompt_ids=ids if body.return_token_ids else None)

        def close() -> None:
            stream.cancel()
            self.served.release(stream)

        if body.stream:
            return SSEResponse(gen.sse(params.n), on_close=close)
        try:
            return JSONResponse(await gen.collect(request))
        finally:
            close()


def _check_limits(model: Model, ids: list[int], params: SamplingParams, max_tokens_param: str,
                  prompt_param: str) -> None:
    max_len = model.engine.info.max_model_len
    if params.max_tokens is not None and len(ids) + params.max_tokens > max_len:
        raise APIError(
            f"This model's maximum context length is {max_len} tokens. However, you "
            f"requested {len(ids) + params.max_tokens} tokens ({len(ids)} in the "
            f"{prompt_param}, {params.max_tokens} in the completion). Please reduce the "
            f"length of the {prompt_param} or the completion.",
            param=max_tokens_param if len(ids) < max_len else prompt_param,
            code="context_length_exceeded")
    max_seqs = model.engine.info.max_num_seqs
    if params.n > max_seqs:
        raise APIError(f"n is {params.n}; this server runs at most {max_seqs} sequences "
                       "at once.", param="n", code="invalid_value")


def _params(body: ChatCompletionRequest | CompletionRequest, prompt_param: str) -> SamplingParams:
    try:
        return body.sampling_params()
    except ValueError as exc:
        raise from_value_error(exc, prompt_param) from exc
