"""Anthropic Messages requests in the shapes the rest of the server uses.

- `chat_messages(body)`: the conversation as OpenAI-shaped chat messages, which the chat template
  renders: `system` becomes a system message; a user message's text blocks one user message,
  each `tool_result` block a `role: "tool"` message carrying `tool_call_id` (its text, marked
  as an error when `is_error`); an assistant message's text its content and its `tool_use`
  blocks `tool_calls` (arguments as JSON text); with `RequestImages` (a vision-language
  model), a user message's `image` blocks are read (api/images.py, the server's image policy)
  and its content becomes text and image parts. Blocks of other types are refused by name.
- `openai_tool_fields(body)`: `tools` as OpenAI function tools, `tool_choice` in OpenAI's
  shapes (`any` -> "required", `tool` -> the named function) and `disable_parallel_tool_use`
  as `parallel_tool_calls`, which the OpenAI routes' tool handling (api/structured.py) takes.
- `sampling_params(body)`: the engine's SamplingParams (Anthropic's defaults: temperature 1).
- `thinking(body, fmt)`: `thinking` as a thinking budget and the chat template's
  `enable_thinking` for a reasoning model (chat/reasoning.py): "enabled" -> its budget_tokens
  (any number >= 0: Anthropic's minimum of 1024 and its cap below max_tokens are not enforced),
  "adaptive" -> no budget, "disabled" -> the template's no-thinking prompt where it has one and
  a budget of 0 (the engine closes the reasoning at once), so no thinking block comes back.
  A model that marks no reasoning ignores it, as clients send it to any model.
  Assistant `thinking` and `redacted_thinking` blocks are dropped from the prompt, as Anthropic
  does with earlier turns' thinking (the template renders earlier replies' answers only).

Every refusal is an APIError naming the field, answered as a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

from localpaged.api.anthropic.protocol import (
    CountTokensRequest,
    ImageBlock,
    Message,
    MessagesRequest,
    OtherBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from localpaged.api.errors import APIError
from localpaged.api.images import RequestImages
from localpaged.api.protocol import check_text
from localpaged.chat.reasoning import ReasoningFormat
from localpaged.core.sampling_params import SamplingParams

ERROR_PREFIX = "Error: "        # before a tool result sent with is_error


def _refuse_block(block: OtherBlock, param: str) -> APIError:
    return APIError(f"Content blocks of type '{block.type}' are not supported by this server "
                    f"({param}); send text, tool_use and tool_result blocks.", param=param,
                    code="unsupported_content")


def _text_of(blocks: list, param: str) -> str:
    """The text of text blocks; any other block is refused."""
    for j, b in enumerate(blocks):
        if not isinstance(b, TextBlock):
            raise _refuse_block(b, f"{param}[{j}]")
    return check_text("".join(b.text for b in blocks), param)


def _system(body: CountTokensRequest) -> list[dict]:
    if body.system is None:
        return []
    text = body.system if isinstance(body.system, str) else _text_of(body.system, "system")
    return [{"role": "system", "content": check_text(text, "system")}] if text else []


def _tool_result(block: ToolResultBlock, param: str) -> dict:
    content = block.content or ""
    text = content if isinstance(content, str) else _text_of(content, f"{param}.content")
    if block.is_error:
        text = ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": block.tool_use_id,
            "content": check_text(text, f"{param}.content")}


def _call(block: ToolUseBlock) -> dict:
    return {"id": block.id, "type": "function",
            "function": {"name": block.name,
                         "arguments": json.dumps(block.input, ensure_ascii=False)}}


def _content(parts: list[dict]) -> str | list[dict]:
    """A message's content: its text, or its parts where it holds an image."""
    if any(p["type"] == "image" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _message(m: Message, param: str, called: set[str],
             images: RequestImages | None) -> list[dict]:
    """One message: its text (and images) and tool calls as one message of its role, each tool
    result (in a user message) as a tool message, in the order of the blocks."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": check_text(m.content, param)}]
    out: list[dict] = []
    parts: list[dict] = []
    calls: list[dict] = []
    for j, b in enumerate(m.content):
        where = f"{param}[{j}]"
        if isinstance(b, TextBlock):
            parts.append({"type": "text", "text": check_text(b.text, where)})
        elif isinstance(b, ImageBlock) and m.role == "user" and images is not None:
            images.read(b.url(), where)
            parts.append({"type": "image"})
        elif isinstance(b, ImageBlock):
            raise APIError(f"{where} is an image block" + (
                " in an assistant message; images belong in user messages." if m.role != "user"
                else ", and this model takes no images (it is text-only, or its image "
                     "processor could not be loaded)."), param=where, code="unsupported_content")
        elif isinstance(b, ToolUseBlock) and m.role == "assistant":
            called.add(b.id)
            calls.append(_call(b))
        elif isinstance(b, ToolResultBlock) and m.role == "user":
            if b.tool_use_id not in called:
                raise APIError(f"{where}.tool_use_id is '{b.tool_use_id}', which no earlier "
                               "tool_use block has as its id.", param=f"{where}.tool_use_id",
                               code="invalid_value")
            if parts:
                out.append({"role": "user", "content": _content(parts)})
                parts = []
            out.append(_tool_result(b, where))
        elif isinstance(b, (ThinkingBlock, RedactedThinkingBlock)) and m.role == "assistant":
            continue                           # an earlier reply's reasoning: not prompted
        elif isinstance(b, (ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock)):
            raise APIError(f"{where} is a {b.type} block in a {m.role} message; tool_use and "
                           "thinking blocks belong in assistant messages, tool_result blocks "
                           "in user messages.", param=where, code="invalid_value")
        else:
            raise _refuse_block(b, where)
    if parts or calls or not out:
        out.append({"role": m.role, "content": _content(parts)})
        if calls:
            out[-1]["tool_calls"] = calls
    return out


def has_images(body: CountTokensRequest) -> bool:
    return any(isinstance(b, ImageBlock) for m in body.messages if not isinstance(m.content, str)
               for b in m.content)


def chat_messages(body: CountTokensRequest, images: RequestImages | None = None) -> list[dict]:
    """The conversation as OpenAI-shaped chat messages (system first). With `images`, a user
    message's image blocks are read into it and its content is parts ({"type": "text"} /
    {"type": "image"}, as processors' chat templates take them); without, they are refused."""
    out = _system(body)
    called: set[str] = set()
    for i, m in enumerate(body.messages):
        out.extend(_message(m, f"messages[{i}].content", called, images))
    return out


def prefills(messages: list[dict]) -> bool:
    """Whether the reply continues the last message: Anthropic's prefill, a final assistant
    message with text and no tool call."""
    last = messages[-1]
    return last["role"] == "assistant" and bool(last["content"]) and "tool_calls" not in last


def _openai_tools(body: CountTokensRequest) -> list[dict]:
    """`tools` as OpenAI function tools; server tools (a `type` other than custom) refused."""
    out = []
    for i, t in enumerate(body.tools or ()):
        if t.type not in (None, "custom"):
            raise APIError(f"tools[{i}] is a server tool of type '{t.type}', which this server "
                           "does not run; send client tools (name, description, input_schema).",
                           param=f"tools[{i}].type", code="unsupported_parameter")
        if t.input_schema is None:
            raise APIError(f"tools[{i}].input_schema is required: the JSON schema of the tool's "
                           "input.", param=f"tools[{i}].input_schema",
                           code="missing_required_parameter")
        function = {"name": t.name, "parameters": t.input_schema}
        if t.description is not None:
            function["description"] = t.description
        out.append({"type": "function", "function": function})
    return out


def _openai_tool_choice(body: CountTokensRequest) -> str | dict | None:
    """`tool_choice` in OpenAI's shapes: `any` -> "required", `tool` -> the named function."""
    choice = body.tool_choice
    if choice is None:
        return None
    if choice.type in ("auto", "none"):
        return choice.type
    if not body.tools:
        raise APIError(f"tool_choice '{choice.type}' needs tools to choose from.",
                       param="tool_choice", code="invalid_value")
    if choice.type == "any":
        return "required"
    if choice.name is None:
        raise APIError("tool_choice of type 'tool' needs the tool's name.",
                       param="tool_choice.name", code="missing_required_parameter")
    return {"type": "function", "function": {"name": choice.name}}


def openai_tool_fields(body: CountTokensRequest) -> SimpleNamespace:
    """The tool fields of a chat completion request (tools, tool_choice, parallel_tool_calls)
    that say the same as this request's, for the OpenAI routes' tool handling."""
    parallel = not (body.tool_choice and body.tool_choice.disable_parallel_tool_use)
    return SimpleNamespace(tools=_openai_tools(body), tool_choice=_openai_tool_choice(body),
                           parallel_tool_calls=parallel)


def sampling_params(body: MessagesRequest) -> SamplingParams:
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
        stop=body.stop_sequences, max_tokens=body.max_tokens)


@dataclass(frozen=True)
class Thinking:
    """What a request's `thinking` asks of a reasoning model."""
    budget: int | None = None                                  # reasoning tokens; None: no limit
    template_kwargs: dict = field(default_factory=dict)        # enable_thinking, for the template


def thinking(body: CountTokensRequest, fmt: ReasoningFormat | None) -> Thinking:
    config = body.thinking
    if config is not None and config.type == "enabled" and config.budget_tokens is None:
        raise APIError("thinking of type 'enabled' needs budget_tokens: the most tokens the "
                       "model may reason for.", param="thinking.budget_tokens",
                       code="missing_required_parameter")
    if config is None or fmt is None:
        return Thinking()
    if config.type == "disabled":
        return Thinking(0, {"enable_thinking": False})
    return Thinking(config.budget_tokens, {"enable_thinking": True})
