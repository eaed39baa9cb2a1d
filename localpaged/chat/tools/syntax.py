"""What the tool-call parser (parsing.py) reads and reports: a family's `Syntax`, the deltas a
streamed reply is told apart into, and the small scanners over JSON text and markers it uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Syntax:
    openers: tuple[str, ...]            # consumed markers that open a call region
    inline: tuple[str, ...] = ()        # text that opens a region and is part of it
    array: bool = False                 # the region is a JSON array of call objects
    closer: str | None = None           # the marker that closes a region
    separators: str = ""                # besides whitespace, dropped between calls
    # The call is written name first, up to this marker, then its arguments' JSON object
    # (Mistral's newer tokenizers: `[TOOL_CALLS]name[ARGS]{...}`); an optional `[CALL_ID]id`
    # may sit between the name and the marker.
    args_marker: str | None = None


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgsDelta:
    index: int
    text: str


Delta = TextDelta | CallStart | ArgsDelta


class JsonScanner:
    """Where a JSON value ends: depth of brackets outside strings."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped, self.started = 0, False, False, False

    def step(self, ch: str) -> bool:
        """Take one character; True when it ends the (object or array) value."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
            return False
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            return self.started and self.depth <= 0
        if not ch.isspace():
            self.started = True
        return False



def name_and_args(obj) -> tuple[str | None, dict | None]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None, None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):           # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return obj["name"], None
    if args is None and "arguments" not in obj and "parameters" not in obj:
        args = {}
    return obj["name"], args if isinstance(args, dict) else None


def is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def held_marker(buf: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `buf` that is the start of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), best, -1):
            if buf.endswith(m[:k]):
                best = k
                break
    return best


def merged(deltas: list[Delta]) -> list[Delta]:
    """Neighbouring text deltas, and argument deltas of one call, joined."""
    out: list[Delta] = []
    for d in deltas:
        last = out[-1] if out else None
        if isinstance(d, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + d.text)
        elif isinstance(d, ArgsDelta) and isinstance(last, ArgsDelta) and last.index == d.index:
            out[-1] = ArgsDelta(d.index, last.text + d.text)
        else:
            out.append(d)
    return out
