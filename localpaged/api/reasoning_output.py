"""A chat reply of a reasoning model in OpenAI's shape, as vLLM and DeepSeek's API give it: the
reasoning in `message.reasoning_content` (streamed as `delta.reasoning_content`, before the
content deltas), the answer in `content` without the markers, the reasoning's tokens in
`usage.completion_tokens_details.reasoning_tokens`.

Request fields (protocol.ChatCompletionRequest), read by `reasoning_request`:
- `max_reasoning_tokens` (ours): the thinking budget in tokens; once spent, the engine writes the
  closing marker itself and the answer follows (core/reasoning_budget.py). A 400 for a model that
  marks no reasoning.
- `reasoning_effort` ("low" | "medium" | "high"): a budget from chat/reasoning.EFFORT_BUDGETS;
  `max_reasoning_tokens` wins when both are sent; ignored by a model that marks no reasoning
  (OpenAI clients send it to any model).
- `chat_template_kwargs` (vLLM's) and `enable_thinking` (Qwen's, the top-level one wins): go to the
  chat template, which reads `enable_thinking` where it supports it (Qwen3); others ignore it.
"""

from __future__ import annotations

from dataclasses import replace

from localpaged.api.errors import APIError
from localpaged.api.protocol import ChatCompletionRequest
from localpaged.chat.reasoning import ReasoningFormat, ReasoningParser, Split, effort_budget
from localpaged.core.sampling_params import SamplingParams

# chat_template_kwargs that would replace what the server itself passes to the template
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                                      "continue_final_message", "tokenize", "return_dict"})


def reasoning_request(body: ChatCompletionRequest, params: SamplingParams,
                      fmt: ReasoningFormat | None) -> tuple[SamplingParams, dict]:
    """The request's params with its model's reasoning markers and budget, and the keyword
    arguments it asks the chat template for."""
    kwargs = dict(body.chat_template_kwargs or {})
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise APIError(f"chat_template_kwargs may not set '{key}' (the server passes it).",
                           param="chat_template_kwargs", code="invalid_value")
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise APIError("chat_template_kwargs.enable_thinking must be true or false.",
                       param="chat_template_kwargs", code="invalid_value")
    if body.enable_thinking is not None:
        kwargs["enable_thinking"] = body.enable_thinking
    if fmt is None:
        if body.max_reasoning_tokens is not None:
            raise APIError("max_reasoning_tokens needs a model that marks its reasoning; this "
                           "model's chat template marks none.", param="max_reasoning_tokens",
                           code="unsupported_parameter")
        return params, kwargs
    budget = body.max_reasoning_tokens
    if budget is None and body.reasoning_effort is not None:
        budget = effort_budget(body.reasoning_effort)
    return replace(params, reasoning_markers=fmt.markers, reasoning_budget=budget), kwargs


class ReasoningReplies:
    """The n choices of one Generation of a reasoning model, each with its own parser."""

    def __init__(self, fmt: ReasoningFormat, n: int, prompt_ids: list[int]) -> None:
        self.fmt = fmt
        self.prompt_ids = prompt_ids
        self._parsers: list[ReasoningParser] = [fmt.parser(prompt_ids) for _ in range(n)]

    def split(self, text: str) -> Split:
        """A whole reply's reasoning and content."""
        return self.fmt.split(text, self.prompt_ids)

    def feed(self, i: int, text: str, done: bool) -> Split:
        """Choice i's new text, split (and the parser's rest once it is done)."""
        parser = self._parsers[i]
        out = parser.feed(text) if text else Split()
        return out + parser.finish() if done else out


def with_reasoning(message: dict, split: Split) -> dict:
    """An assistant message with its reasoning beside the content."""
    return {**message, "reasoning_content": split.reasoning or None}


def reasoning_row(i: int, text: str) -> dict:
    """A stream choice entry carrying reasoning text alone."""
    return {"index": i, "delta": {"reasoning_content": text}, "logprobs": None,
            "finish_reason": None}
