"""GuidedDecoding: what a request's output must match (a JSON schema, any JSON object, a regex,
a grammar, one of fixed strings, or a structural tag), as plain validated data.

This module only describes the constraint; engine/grammar.py compiles it (once per distinct
spec and tokenizer) and keeps a matcher per sequence. A spec is hashable and its `key` is what
the compile cache keys on, so the same schema sent twice compiles once.

Kinds (the names follow vLLM's guided decoding; `value` is always text):
- "json_object": any JSON object (OpenAI's `response_format: {"type": "json_object"}`); no value.
- "json_schema": a JSON schema as compact JSON text, OpenAI's `json_schema.schema` (its key order
  kept: properties are generated in that order).
- "regex": a regular expression the whole output matches.
- "grammar": an EBNF grammar (GBNF-style, with a `root` rule).
- "choice": one of a list of strings, as a JSON array.
- "structural_tag": free text in which tagged regions follow schemas (tool calls: a begin
  marker, JSON arguments under the tool's schema, an end marker), as xgrammar's structural tag
  JSON ({"type": "structural_tag", "format": {...}}).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

GUIDED_KINDS = ("json_object", "json_schema", "regex", "grammar", "choice", "structural_tag")
MAX_GUIDED_CHARS = 256 * 1024        # a schema or grammar larger than this is refused


@dataclass(frozen=True)
class GuidedDecoding:
    kind: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GUIDED_KINDS:
            raise ValueError(f"guided decoding kind must be one of "
                             f"{', '.join(map(repr, GUIDED_KINDS))}, got {self.kind!r}")
        if not isinstance(self.value, str):
            raise ValueError(f"guided decoding value must be text, got {type(self.value).__name__}")
        if self.kind != "json_object" and not self.value.strip():
            raise ValueError(f"guided decoding {self.kind!r} needs a non-empty value")
        if len(self.value) > MAX_GUIDED_CHARS:
            raise ValueError(f"guided decoding {self.kind!r} is {len(self.value):,} characters; "
                             f"at most {MAX_GUIDED_CHARS:,} are accepted")

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.value

    @property
    def label(self) -> str:
        """How an error names this constraint to the user."""
        return {"json_object": "the JSON object constraint", "json_schema": "the JSON schema",
                "regex": "the regex", "grammar": "the grammar", "choice": "the choice list",
                "structural_tag": "the structural tag"}[self.kind]

    # ---- constructors from the shapes callers hold ----------------------------------------------
    @classmethod
    def json_object(cls) -> "GuidedDecoding":
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: dict | bool | str) -> "GuidedDecoding":
        """A schema as a dict (or JSON text of one); kept as canonical JSON text."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
        return cls("json_schema", _canonical(schema))

    @classmethod
    def regex(cls, pattern: str) -> "GuidedDecoding":
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, ebnf: str) -> "GuidedDecoding":
        return cls("grammar", ebnf)

    @classmethod
    def choice(cls, options: list[str]) -> "GuidedDecoding":
        if not options or not all(isinstance(o, str) and o for o in options):
            raise ValueError("a choice needs a non-empty list of non-empty strings")
        return cls("choice", json.dumps(list(options)))

    @classmethod
    def structural_tag(cls, tag: dict[str, Any] | str) -> "GuidedDecoding":
        if isinstance(tag, str):
            try:
                tag = json.loads(tag)
            except json.JSONDecodeError as e:
                raise ValueError(f"the structural tag is not valid JSON: {e}") from None
        if not isinstance(tag, dict):
            raise ValueError(f"a structural tag must be an object, got {type(tag).__name__}")
        return cls("structural_tag", _canonical(tag))


def _canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)    # key order is kept
