"""The tool-call families, told apart by what a chat template declares, and the grammar that
makes a model write its family's calls.

- "hermes": Hermes, Qwen2.5, Qwen3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
- "llama3": Llama 3.1 / 3.2 JSON calls `{"name": ..., "parameters": {...}}` (results in the
  `ipython` role, which the template makes of `role: "tool"`).
- "mistral": `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
- "mistral_v11": Mistral's newer tokenizers (Mistral Small 3.x, Devstral, Magistral):
  `[TOOL_CALLS]name[ARGS]{...}`, one `[TOOL_CALLS]` per call (an optional `[CALL_ID]id` before
  `[ARGS]`).
- "generic": a template that knows no tools. We describe the tools in a system message
  (prompt.py) and ask for the hermes syntax, which the grammar then enforces after its trigger.

A family's markers are special tokens in some vocabularies (Mistral's, Llama's
`<|python_tag|>`), which a reply's text leaves out: `ToolFormat.marker_ids` names those, for
SamplingParams.text_special_tokens, so that the parser sees them.

`ToolFormat.guided` builds an xgrammar structural tag (core/guided.py's "structural_tag" kind):
for "auto", free text in which each call, once its trigger is written, is held to the called
tool's JSON schema; for "required", at least one call and nothing before it; for a named tool,
exactly that call. So with "required" or a named tool the arguments always validate. Runs of
whitespace inside arguments are bounded (MAX_WHITESPACE).
"""

from __future__ import annotations

from dataclasses import dataclass

from localpaged.chat.tools.parsing import StreamParser, Syntax, parse
from localpaged.chat.tools.spec import Choice, ParsedReply, ToolSpec, call_id, normalize_choice
from localpaged.core.guided import GuidedDecoding

FAMILIES = ("hermes", "llama3", "mistral", "mistral_v11", "generic")
# Whitespace in a row inside call arguments: room for indented JSON, but a model cannot spend
# its tokens on blank space before the call is written (templates write compact JSON).
MAX_WHITESPACE = 8

_HERMES = Syntax(openers=("<tool_call>",), closer="</tool_call>")
_SYNTAX = {
    "hermes": _HERMES,
    "generic": _HERMES,
    "llama3": Syntax(openers=("<|python_tag|>",), inline=('{"name"',), separators=";"),
    "mistral": Syntax(openers=("[TOOL_CALLS]",), inline=('[{"name"',), array=True),
    "mistral_v11": Syntax(openers=("[TOOL_CALLS]",), args_marker="[ARGS]"),
}
# Markers that a vocabulary may hold as special tokens, by family.
_MARKERS = {"llama3": ("<|python_tag|>",), "mistral": ("[TOOL_CALLS]",),
            "mistral_v11": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")}


@dataclass(frozen=True)
class _CallText:
    """How a grammar writes one call: begin + arguments JSON + end, and the trigger of auto."""
    trigger: str
    begin: str                  # with {name} where the tool's name goes
    end: str


_CALL_TEXT = {
    "hermes": _CallText("<tool_call>", '<tool_call>\n{{"name": "{name}", "arguments": ',
                        "}\n</tool_call>"),
    "llama3": _CallText('{"name": ', '{{"name": "{name}", "parameters": ', "}"),
    "mistral": _CallText("[TOOL_CALLS]", '[TOOL_CALLS][{{"name": "{name}", "arguments": ', "}]"),
    "mistral_v11": _CallText("[TOOL_CALLS]", "[TOOL_CALLS]{name}[ARGS]", ""),
}
_CALL_TEXT["generic"] = _CALL_TEXT["hermes"]


@dataclass(frozen=True)
class ToolFormat:
    family: str

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"tool format must be one of {FAMILIES}, got {self.family!r}")

    @property
    def template_has_tools(self) -> bool:
        """Whether the chat template itself renders `tools=` (else prompt.py describes them)."""
        return self.family != "generic"

    @property
    def syntax(self) -> Syntax:
        return _SYNTAX[self.family]

    def marker_ids(self, tokenizer) -> tuple[int, ...]:
        """The ids of this family's markers that are special tokens of `tokenizer` (a reply's
        text keeps them only when asked: SamplingParams.text_special_tokens)."""
        special = {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        return tuple(special[m] for m in _MARKERS.get(self.family, ()) if m in special)

    def new_id(self) -> str:
        return call_id(self.family)

    def parse(self, text: str) -> ParsedReply:
        return parse(self.syntax, self.new_id, text)

    def stream_parser(self) -> StreamParser:
        return StreamParser(self.syntax, self.new_id)

    def call_text(self, name: str, arguments: str) -> str:
        """One call as this family writes it (what the grammar of a named call accepts)."""
        t = _CALL_TEXT[self.family]
        return t.begin.format(name=name) + arguments + t.end

    def guided(self, tools: list[ToolSpec] | None, tool_choice="auto",
               parallel_tool_calls: bool = True) -> GuidedDecoding | None:
        """The constraint for a reply with these tools (None: no tools, or tool_choice none)."""
        choice = tool_choice if isinstance(tool_choice, Choice) else \
            normalize_choice(tool_choice, tools)
        if choice.mode == "none" or not tools:
            return None
        t = _CALL_TEXT[self.family]

        def tag(tool: ToolSpec) -> dict:
            return {"type": "tag", "begin": t.begin.format(name=tool.name),
                    "content": {"type": "json_schema", "json_schema": tool.parameters,
                                "max_whitespace_cnt": MAX_WHITESPACE},
                    "end": t.end}

        if choice.mode == "named":
            fmt = tag(next(x for x in tools if x.name == choice.name))
        else:
            fmt = {"type": "triggered_tags", "triggers": [t.trigger],
                   "tags": [tag(x) for x in tools], "at_least_one": choice.mode == "required",
                   "stop_after_first": not parallel_tool_calls}
        return GuidedDecoding.structural_tag({"type": "structural_tag", "format": fmt})


def tool_format(chat_template: str | None) -> ToolFormat:
    """The family a chat template's tool calls belong to, from the markers it declares."""
    text = chat_template or ""
    if "[ARGS]" in text:
        return ToolFormat("mistral_v11")
    if "[TOOL_CALLS]" in text or "[AVAILABLE_TOOLS]" in text:
        return ToolFormat("mistral")
    if "<|python_tag|>" in text or "ipython" in text:
        return ToolFormat("llama3")
    if "<tool_call>" in text:
        return ToolFormat("hermes")
    return ToolFormat("generic")

