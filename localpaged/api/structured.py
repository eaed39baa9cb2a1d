"""Structured output and tools in a request: what the reply must match, as one GuidedDecoding,
and the tools offered to the model.

Output constraints, at most one per request (two are a 400 naming the second):
- OpenAI's `response_format`: {"type": "text"} (none), {"type": "json_object"},
  {"type": "json_schema", "json_schema": {"name", "schema", "strict"}};
- vLLM's extensions `guided_json` (a schema, or its JSON text), `guided_regex`,
  `guided_grammar` (EBNF), `guided_choice` (a list of strings), and their newer spelling
  `structured_outputs: {"json" | "regex" | "grammar" | "choice": ...}`.

Tools (chat only): `tools` become ToolSpecs, `tool_choice` is normalized against them, and
`ToolRequest` gives the prompt (chat/tool_calls.prompt_messages with the model's template
family) and the grammar of the calls (ToolFormat.guided: with "required" or a named function the
arguments always validate). tool_choice "none" renders no tools and parses no calls.
Every error is an APIError naming the parameter (`tools[2]`, `tool_choice`, `response_format`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from localpaged.api.errors import APIError
from localpaged.chat.tool_calls import (
    Choice,
    ToolFormat,
    ToolSpec,
    normalize_choice,
    prompt_messages,
    tool_format,
)
from localpaged.core.guided import GuidedDecoding
from localpaged.core.sampling_params import SamplingParams

_STRUCTURED_KEYS = {"json": "json_schema", "regex": "regex", "grammar": "grammar",
                    "choice": "choice"}


def _bad(param: str, message: str) -> APIError:
    return APIError(message, param=param, code="invalid_value")


def _spec(kind: str, value: Any, param: str) -> GuidedDecoding:
    try:
        if kind == "json_schema":
            return GuidedDecoding.json_schema(value)
        if kind == "choice":
            if not isinstance(value, list):
                raise ValueError("a choice must be a list of strings")
            return GuidedDecoding.choice(value)
        if not isinstance(value, str):
            raise ValueError(f"must be text, got {type(value).__name__}")
        return GuidedDecoding(kind, value)
    except ValueError as exc:
        raise _bad(param, f"Invalid '{param}': {exc}") from exc


def _response_format(rf: dict) -> GuidedDecoding | None:
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return GuidedDecoding.json_object()
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or "schema" not in js:
            raise _bad("response_format.json_schema",
                       "response_format json_schema needs {'name': ..., 'schema': {...}}.")
        return _spec("json_schema", js["schema"], "response_format.json_schema.schema")
    raise _bad("response_format.type", f"response_format type must be 'text', 'json_object' "
                                       f"or 'json_schema', got {kind!r}.")


def output_constraint(body) -> tuple[GuidedDecoding | None, str | None]:
    """(the request's output constraint, the parameter that asked for it)."""
    found: list[tuple[GuidedDecoding, str]] = []
    if body.response_format is not None:
        spec = _response_format(body.response_format)
        if spec is not None:
            found.append((spec, "response_format"))
    for field, kind in (("guided_json", "json_schema"), ("guided_regex", "regex"),
                        ("guided_grammar", "grammar"), ("guided_choice", "choice")):
        value = getattr(body, field)
        if value is not None:
            found.append((_spec(kind, value, field), field))
    so = body.structured_outputs
    if so:
        unknown = set(so) - set(_STRUCTURED_KEYS)
        if unknown:
            raise _bad("structured_outputs", f"structured_outputs takes one of "
                       f"{sorted(_STRUCTURED_KEYS)}, got {sorted(unknown)}.")
        for key, value in so.items():
            found.append((_spec(_STRUCTURED_KEYS[key], value, f"structured_outputs.{key}"),
                          "structured_outputs"))
    if len(found) > 1:
        raise _bad(found[1][1], f"Only one output constraint per request: '{found[0][1]}' "
                                f"and '{found[1][1]}' were both given.")
    return found[0] if found else (None, None)


@dataclass
class ToolRequest:
    tools: list[ToolSpec]
    choice: Choice
    parallel: bool
    fmt: ToolFormat
    markers: tuple[int, ...] = ()       # the family's markers that are special tokens

    def apply(self, params: SamplingParams) -> SamplingParams:
        """params held to the calls' grammar, keeping the markers the parser reads in the text
        (params itself, unchanged, for tool_choice "none")."""
        guided = self.guided()
        if guided is None:
            return params
        return replace(params, guided=guided, text_special_tokens=self.markers)

    @property
    def active(self) -> bool:
        """Whether tools are offered (and calls parsed): not for tool_choice "none"."""
        return self.choice.mode != "none"

    def guided(self) -> GuidedDecoding | None:
        return self.fmt.guided(self.tools, self.choice, self.parallel)

    def prompt(self, messages: list[dict]) -> tuple[list[dict], dict]:
        try:
            return prompt_messages(messages, self.tools if self.active else None, self.fmt)
        except ValueError as exc:
            raise APIError(str(exc), param="messages", code="invalid_value") from exc


def tool_request(body, tokenizer) -> ToolRequest:
    """The request's tools for a model with this tokenizer and its chat template (400s name
    the parameter)."""
    specs = []
    for i, tool in enumerate(body.tools or []):
        try:
            specs.append(ToolSpec.from_openai(tool))
        except ValueError as exc:
            raise _bad(f"tools[{i}]", f"Invalid tool: {exc}.") from exc
    names = [t.name for t in specs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise _bad("tools", f"Two tools are named {dup!r}.")
    if body.tool_choice is not None and not specs:
        raise _bad("tool_choice", "tool_choice is only allowed when tools are given.")
    try:
        choice = normalize_choice(body.tool_choice, specs)
    except ValueError as exc:
        raise _bad("tool_choice", f"Invalid tool_choice: {exc}.") from exc
    fmt = tool_format(tokenizer.chat_template)
    return ToolRequest(specs, choice, body.parallel_tool_calls is not False, fmt,
                       fmt.marker_ids(tokenizer))


def constrain(params: SamplingParams, body,
              tools: ToolRequest | None) -> tuple[SamplingParams, str | None]:
    """SamplingParams with the request's constraint (the calls' grammar when tools are offered,
    else the output constraint), and the parameter a compile error is to name."""
    spec, param = output_constraint(body)
    held = tools.apply(params) if tools is not None else params
    if held is not params:                    # the calls' grammar (tools offered, not "none")
        if spec is not None:
            raise _bad(param, f"'{param}' cannot be combined with tools unless tool_choice is "
                              "'none' (the reply is then held to it instead of calling tools).")
        return held, "tools"
    return (replace(params, guided=spec) if spec is not None else params), param
