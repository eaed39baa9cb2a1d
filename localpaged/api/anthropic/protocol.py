"""Typed request bodies of the Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`).

Types are strict, as on the OpenAI routes (api/protocol.py): a string is not a number, NaN is
refused, and a bad field is a 400 naming it before anything reaches the engine. Lists have the
same caps as there; the body's size limit and the prompt's bound limit the text. Content blocks
are `text`, `image` (base64 or url source, in user messages), `tool_use`, `tool_result`,
`thinking` and `redacted_thinking` (an earlier reply's reasoning, which conversion drops); any
other type (document, ...) parses as `OtherBlock` so that conversion can refuse it by name.
`thinking` ({"type": "enabled", "budget_tokens": N}, "adaptive" or "disabled") is read by
convert.thinking. Fields this server has no use for (`metadata`, `service_tier`,
`cache_control` on blocks, ...) are ignored, as Anthropic's clients send a few of their own.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from localpaged.api.protocol import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_NAME_CHARS,
    MAX_TOOLS,
    StopList,
)

_CONFIG = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

# Anthropic's rule for a tool's name, which the OpenAI function-name rule also accepts.
ToolName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")


class OtherBlock(BaseModel):
    """A content block of a type this server does not take: recognised, then refused by name."""
    model_config = ConfigDict(strict=True, extra="allow")
    type: str


def _tag(value: Any, known: tuple[str, ...] = BLOCK_TYPES) -> str:
    """Which model parses a content block: its own type when known, else OtherBlock. A tag is
    not an identifier, so an error's parameter name leaves it out (errors._param)."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"{kind} block" if kind in known else "other block"


class TextBlock(BaseModel):
    model_config = _CONFIG
    type: Literal["text"]
    text: str


class Base64Source(BaseModel):
    model_config = _CONFIG
    type: Literal["base64"]
    media_type: Annotated[str, Field(max_length=MAX_NAME_CHARS)]
    data: str


class UrlSource(BaseModel):
    model_config = _CONFIG
    type: Literal["url"]
    url: str


class ImageBlock(BaseModel):
    """An image in a user message (a vision-language model's input): base64 bytes or a URL,
    read under the server's image policy (api/images.py)."""
    model_config = _CONFIG
    type: Literal["image"]
    source: Annotated[Union[Base64Source, UrlSource], Field(discriminator="type")]

    def url(self) -> str:
        """The source as api/images.py reads it: a data: URL, or the URL itself."""
        src = self.source
        return f"data:{src.media_type};base64,{src.data}" if isinstance(src, Base64Source) \
            else src.url


class ToolUseBlock(BaseModel):
    """A tool call the assistant made earlier in the conversation."""
    model_config = _CONFIG
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    name: ToolName
    input: dict[str, Any]


ResultPart = Annotated[Union[Annotated[TextBlock, Tag("text block")],
                             Annotated[OtherBlock, Tag("other block")]],
                       Discriminator(lambda v: _tag(v, ("text",)))]


class ToolResultBlock(BaseModel):
    """The result of a tool call, sent back in a user message."""
    model_config = _CONFIG
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    content: str | Annotated[list[ResultPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    is_error: bool | None = False


class ThinkingBlock(BaseModel):
    """An earlier reply's reasoning, sent back with it (dropped from the prompt)."""
    model_config = _CONFIG
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(BaseModel):
    """An earlier reply's reasoning as Anthropic encrypts it (dropped from the prompt)."""
    model_config = _CONFIG
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[Union[Annotated[TextBlock, Tag("text block")],
                        Annotated[ImageBlock, Tag("image block")],
                        Annotated[ToolUseBlock, Tag("tool_use block")],
                        Annotated[ToolResultBlock, Tag("tool_result block")],
                        Annotated[ThinkingBlock, Tag("thinking block")],
                        Annotated[RedactedThinkingBlock, Tag("redacted_thinking block")],
                        Annotated[OtherBlock, Tag("other block")]],
                  Discriminator(_tag)]


class Message(BaseModel):
    model_config = _CONFIG
    role: Literal["user", "assistant"]
    content: str | Annotated[list[Block], Field(max_length=MAX_CONTENT_PARTS)]


class Tool(BaseModel):
    """A client tool. Anthropic's server tools carry a `type` (web_search_..., bash_...), and
    convert.py refuses them."""
    model_config = _CONFIG
    name: ToolName
    description: str | None = None
    input_schema: dict[str, Any] | None = None      # required of client tools (convert.py)
    type: str | None = None


class ToolChoice(BaseModel):
    model_config = _CONFIG
    type: Literal["auto", "any", "tool", "none"]
    name: ToolName | None = None
    disable_parallel_tool_use: bool | None = False


class ThinkingConfig(BaseModel):
    """Extended thinking: "enabled" with a budget of reasoning tokens, "adaptive" (the model's
    own length) or "disabled"."""
    model_config = _CONFIG
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: Annotated[int, Field(ge=0)] | None = None


class CountTokensRequest(BaseModel):
    """What decides the prompt: the body of /v1/messages/count_tokens."""
    model_config = _CONFIG

    model: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: str | Annotated[list[TextBlock], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    """The body of /v1/messages."""
    max_tokens: Annotated[int, Field(ge=1)]
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    stop_sequences: StopList | None = None
    stream: bool | None = False
    metadata: dict[str, Any] | None = None          # accepted, not used
