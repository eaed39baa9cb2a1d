"""Typed request bodies of the OpenAI-compatible API, and their mapping to SamplingParams.

Types are strict (a string is not a number, 3.0 is not an integer) and NaN/Infinity are refused,
so a bad field is answered with a 400 naming it before anything reaches the engine. Fields the
engine cannot honour (logit_bias, suffix, ...) are refused rather than silently ignored;
other unknown fields are ignored, as OpenAI's clients send a few of their own.
`response_format`, the guided_* extensions and `tools` are read by structured.py; messages carry
assistant `tool_calls` and `role: "tool"` results (with `tool_call_id`) to the chat template.
`echo` on /v1/completions returns the prompt before the completion, and with `logprobs` the
prompt tokens' logprobs (SamplingParams.prompt_logprobs); `max_tokens=0` is allowed with echo
(log-likelihood clients such as lm-eval's local-completions score a text that way).
Extensions beyond OpenAI, as vLLM names them: top_k, min_p, repetition_penalty, ignore_eos,
stop_token_ids; for chat, add_generation_prompt and continue_final_message. Our own extension
`context_overflow` ("error" | "drop_oldest") fits a chat that is too long for the context
(localpaged.chat.context_window); without it nothing is ever dropped. For reasoning models,
`reasoning_effort`, `max_reasoning_tokens`, `enable_thinking` and `chat_template_kwargs` (read by
reasoning_output.py). `speculative: false` keeps a request out of speculative decoding where
the server runs it (`--speculation`). `prune` (ours: {"margin", "after", "every", "keep"}, each
optional) stops the branches of an n > 1 request that fall behind (core/pruning.py); a pruned
choice ends with finish_reason "abort" and says why in its `pruned` field. `return_token_ids` (vLLM's) adds the prompt's and each
choice's token ids to the response, and `return_tokens_as_token_ids` writes logprobs' tokens as
"token_id:N": with both, a client can continue a completion from any of its tokens, or from one
of the alternatives logprobs listed, by sending prompt + token ids[:t] + that token as a
/v1/completions prompt (the prefix cache then computes one token before the first new one).

Every list, map and string a request may carry has a cap (below), so no field can make the
server's work per request unbounded; the body itself is at most MAX_BODY_BYTES (errors.py), and
the prompt's length is bounded by the model's context before it is tokenized (prompt_bound.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from localpaged.api.errors import APIError
from localpaged.core.sampling_params import PruneRule
from localpaged.core.sampling_params import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    SamplingParams,
)

# Caps on what one request may carry. OpenAI's own where it has one (128 tools, 20 top
# logprobs); elsewhere far above what a real client sends, low enough that each is cheap.
MAX_MESSAGES = 4096           # a long chat; the context limit refuses long texts on its own
MAX_CONTENT_PARTS = 256       # content parts of one message
MAX_NAME_CHARS = 256          # model, message name, user
MAX_TOOLS = 128
MAX_LOGIT_BIAS = 300          # entries (logit_bias is refused anyway; this bounds the parsing)
MAX_STOP_TOKEN_IDS = 64
MAX_N = 128                   # samples per request (also at most the engine's max_num_seqs)
MAX_TOP_LOGPROBS = 20
MAX_TOOL_CALLS = 128          # calls of one assistant message
MAX_CHOICES = 1024            # guided_choice options
MAX_TEMPLATE_KWARGS = 16      # chat_template_kwargs entries

_CONFIG = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
StopList = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]


def check_text(text: str, param: str) -> str:
    """Refuse text UTF-8 cannot carry (lone surrogates from JSON escapes): tokenizers fail on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(f"'{param}' is not valid Unicode text: {exc.reason} at position "
                       f"{exc.start}.", param=param, code="invalid_value") from exc
    return text


@dataclass
class Echo:
    """What a completion with echo=true returns before its generated text."""
    prompt: str | list[int]      # the prompt as sent: text, or token ids (decoded for the echo)
    generate: bool = True        # False for max_tokens=0: the prompt alone, no completion


class StreamOptions(BaseModel):
    model_config = _CONFIG
    include_usage: bool | None = False


class Prune(BaseModel):
    """`prune` (ours): parallel thinking's rule for an n > 1 request (core/pruning.py)."""
    model_config = _CONFIG
    margin: Annotated[float, Field(ge=0.0)] = PruneRule.margin
    after: Annotated[int, Field(ge=1)] = PruneRule.after
    every: Annotated[int, Field(ge=1)] = PruneRule.every
    keep: Annotated[int, Field(ge=1)] = PruneRule.keep

    def rule(self) -> PruneRule:
        return PruneRule(self.margin, self.after, self.every, self.keep)


class _Common(BaseModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""
    model_config = _CONFIG

    model: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = 1
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: StopString | StopList | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logit_bias: Annotated[dict[str, float], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    user: Name | None = None
    # extensions (vLLM's names)
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(ge=0.01, le=100.0)] | None = None
    ignore_eos: bool | None = False
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0)]],
                              Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    speculative: bool | None = None       # ours: False keeps this request from being drafted
    prune: Prune | None = None            # ours: stop the n branches that fall behind
    return_token_ids: bool | None = False
    return_tokens_as_token_ids: bool | None = False
    # output constraints (structured.py): OpenAI's, then vLLM's extensions
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: Annotated[list[str], Field(max_length=MAX_CHOICES)] | None = None
    structured_outputs: dict[str, Any] | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def echo_request(self) -> Echo | None:
        return None

    def _check_unsupported(self) -> None:
        if self.logit_bias:
            raise APIError("logit_bias is not supported by this server.", param="logit_bias",
                           code="unsupported_parameter")

    def _sampling(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        temperature = 1.0 if self.temperature is None else self.temperature
        return SamplingParams(      # temperatures near 0 mean greedy (SamplingParams.greedy)
            n=self.n or 1, temperature=temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0, min_p=self.min_p or 0.0,
            repetition_penalty=self.repetition_penalty or 1.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids or [],
            max_tokens=max_tokens, ignore_eos=bool(self.ignore_eos), logprobs=logprobs,
            speculative=self.speculative is not False,
            prune=self.prune.rule() if self.prune is not None else None)


class TextPart(BaseModel):
    model_config = _CONFIG
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = _CONFIG
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(BaseModel):
    """An image (api/images.py reads it under the server's ImagePolicy)."""
    model_config = _CONFIG
    type: Literal["image_url"]
    image_url: ImageURL


class OtherPart(BaseModel):
    """Another content part (audio, file): recognised, then refused."""
    model_config = ConfigDict(strict=True, extra="allow")
    type: str


class FunctionCall(BaseModel):
    model_config = _CONFIG
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    arguments: str


class ToolCallParam(BaseModel):
    """A call an assistant message made: {"id", "type": "function", "function": {...}}."""
    model_config = _CONFIG
    id: Name
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = _CONFIG
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart | ImagePart | OtherPart],
                             Field(max_length=MAX_CONTENT_PARTS)] | None = None
    name: Name | None = None
    tool_calls: Annotated[list[ToolCallParam], Field(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: Name | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def has_non_text(self) -> bool:
        return isinstance(self.content, list) and any(
            not isinstance(p, TextPart) for p in self.content)

    def has_images(self) -> bool:
        return isinstance(self.content, list) and any(isinstance(p, ImagePart) for p in self.content)


class ChatCompletionRequest(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: Annotated[list[Any], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # extensions: vLLM's names for continuing the last assistant message in place
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    # extension: what a conversation too long for the context does (absent: refused)
    context_overflow: Literal["error", "drop_oldest"] | None = None
    # reasoning models (api/reasoning_output.py): OpenAI's effort, our budget, vLLM's and
    # Qwen's switches for the chat template
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    max_reasoning_tokens: Annotated[int, Field(ge=0)] | None = None
    enable_thinking: bool | None = None
    chat_template_kwargs: Annotated[dict[str, Any],
                                    Field(max_length=MAX_TEMPLATE_KWARGS)] | None = None

    def has_images(self) -> bool:
        return any(m.has_images() for m in self.messages)

    def check_template_flags(self) -> None:
        """continue_final_message continues the last assistant message: no generation prompt."""
        if not self.continue_final_message:
            return
        if self.add_generation_prompt is not False:
            raise APIError("continue_final_message requires add_generation_prompt to be false "
                           "(a new assistant turn cannot also continue the last one).",
                           param="continue_final_message", code="invalid_value")
        if self.messages[-1].role != "assistant":
            raise APIError("continue_final_message needs the last message to be the "
                           f"assistant's reply to continue; it is {self.messages[-1].role!r}.",
                           param="continue_final_message", code="invalid_value")

    def template_messages(self) -> list[dict]:
        """The messages in OpenAI's shape with plain-text content (tool calls and results kept;
        structured.ToolRequest.prompt shapes them for the model's template)."""
        out = []
        for i, m in enumerate(self.messages):
            if m.has_non_text():
                raise APIError("Only text content parts are supported by this model.",
                               param=f"messages[{i}].content", code="unsupported_content")
            role = "system" if m.role == "developer" else m.role
            msg: dict = {"role": role,
                         "content": check_text(m.text(), f"messages[{i}].content")}
            if m.tool_calls:
                if role != "assistant":
                    raise APIError("Only assistant messages carry tool_calls.",
                                   param=f"messages[{i}].tool_calls", code="invalid_value")
                msg["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if role == "tool":
                if m.tool_call_id is None:
                    raise APIError("A message with role 'tool' needs the 'tool_call_id' of "
                                   "the call it answers.", param=f"messages[{i}].tool_call_id",
                                   code="missing_required_parameter")
                msg["tool_call_id"] = m.tool_call_id
            out.append(msg)
        return out

    def sampling_params(self) -> SamplingParams:
        self._check_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError("top_logprobs requires logprobs to be true.", param="top_logprobs",
                           code="invalid_value")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens or self.max_tokens
        return self._sampling(max_tokens, logprobs)

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(_Common):
    prompt: str | TokenIds | list[str] | list[TokenIds]
    max_tokens: Annotated[int, Field(ge=0)] | None = 16      # OpenAI's default; 0 only with echo
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool | None = False
    best_of: Annotated[int, Field(ge=1)] | None = None
    suffix: str | None = None

    def prompt_value(self) -> str | list[int]:
        """One prompt: a string or token ids (a one-element batch is unwrapped)."""
        p = self.prompt
        if isinstance(p, list) and (not p or isinstance(p[0], (str, list))):
            if len(p) != 1:
                raise APIError("Send one prompt per request (batched prompts are not supported)"
                               if p else "prompt must not be empty.", param="prompt",
                               code="invalid_value")
            p = p[0]
        return check_text(p, "prompt") if isinstance(p, str) else p

    def sampling_params(self) -> SamplingParams:
        self._check_unsupported()
        if self.max_tokens == 0 and not self.echo:
            raise APIError("max_tokens must be at least 1 (0 is allowed only with echo=true).",
                           param="max_tokens", code="invalid_value")
        if self.suffix:
            raise APIError("suffix is not supported by this server.", param="suffix",
                           code="unsupported_parameter")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise APIError("best_of other than n is not supported by this server.",
                           param="best_of", code="unsupported_parameter")
        # max_tokens=0: the engine samples one token, which the response leaves out
        max_tokens = None if self.max_tokens is None else max(1, self.max_tokens)
        params = self._sampling(max_tokens, self.logprobs)
        if self.echo and self.logprobs is not None:
            params = replace(params, prompt_logprobs=self.logprobs)     # validated again
        return params

    def echo_request(self) -> Echo | None:
        if not self.echo:
            return None
        return Echo(self.prompt_value(), generate=self.max_tokens != 0)

    @property
    def max_tokens_param(self) -> str:
        return "max_tokens"
