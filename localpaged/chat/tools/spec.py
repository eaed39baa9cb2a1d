"""The values a tool exchange is made of: a tool offered to the model (`ToolSpec`), a call the
model made (`ToolCall`), a reply split into its text and its calls (`ParsedReply`), and
`tool_choice` in its one normal form (`Choice`).

A ToolSpec is validated when it is built, so everything below it (prompts, grammars, parsers)
may trust its name and its parameters schema. A ToolCall's `arguments` is JSON text, as the
OpenAI API carries it; a call parsed from a reply always has arguments that parse as an object.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
EMPTY_PARAMETERS: dict = {"type": "object", "properties": {}}
CHOICES = ("auto", "none", "required")
_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict = field(hash=False, compare=True)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise ValueError(f"tool name {self.name!r} must be 1 to 64 letters, digits, "
                             "underscores or dashes")
        if not isinstance(self.description, str):
            raise ValueError(f"tool {self.name!r}: description must be text")
        params = self.parameters
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema of an "
                             f"object (\"type\": \"object\"), got {_shown(params)}")
        try:
            json.dumps(params)
        except (TypeError, ValueError) as e:
            raise ValueError(f"tool {self.name!r}: parameters are not JSON: {e}") from None

    @classmethod
    def from_openai(cls, tool: Any) -> "ToolSpec":
        """From `{"type": "function", "function": {"name", "description", "parameters"}}`."""
        if not isinstance(tool, dict):
            raise ValueError(f"a tool must be an object, got {_shown(tool)}")
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        label = repr(name) if isinstance(name, str) else "without a name"
        if tool.get("type", "function") != "function":
            raise ValueError(f"tool {label}: type must be 'function', got {tool.get('type')!r}")
        if not isinstance(fn, dict):
            raise ValueError("a tool needs a 'function' object with a name")
        if not isinstance(name, str):
            raise ValueError("tool without a name: 'function.name' must be a string")
        params = fn.get("parameters")
        if params is None or params == {}:
            params = dict(EMPTY_PARAMETERS)
        return cls(name, fn.get("description") or "", params)

    def openai(self) -> dict:
        """The OpenAI shape, which Hugging Face chat templates take as `tools=`."""
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str          # JSON text of an object

    def openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedReply:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class Choice:
    """tool_choice, normalized: mode is "auto", "none", "required" or "named" (then `name`)."""
    mode: str
    name: str | None = None


def normalize_choice(choice: Any, tools: list[ToolSpec] | None) -> Choice:
    """tool_choice as OpenAI sends it ("auto" | "none" | "required" | {"type": "function",
    "function": {"name": ...}}), or a bare tool name; ValueError names what is wrong."""
    tools = tools or []
    if choice is None:
        return Choice("auto" if tools else "none")
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type", "function") != "function" or not isinstance(name, str):
            raise ValueError("tool_choice must be 'auto', 'none', 'required' or "
                             "{'type': 'function', 'function': {'name': ...}}")
        choice = Choice("named", name)
    elif isinstance(choice, str):
        choice = Choice(choice) if choice in CHOICES else Choice("named", choice)
    else:
        raise ValueError(f"tool_choice must be a string or an object, got {_shown(choice)}")
    if choice.mode == "auto" and not tools:
        return Choice("none")
    if choice.mode != "none" and not tools:
        raise ValueError(f"tool_choice {choice.name or choice.mode!r} needs tools")
    if choice.mode == "named" and choice.name not in {t.name for t in tools}:
        raise ValueError(f"tool_choice names the function {choice.name!r}, which is not among "
                         f"the tools ({', '.join(t.name for t in tools)})")
    return choice


def call_id(family: str) -> str:
    """A new call id: Mistral's templates require exactly 9 letters and digits."""
    if family.startswith("mistral"):
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
