"""How one tool call is read once its region is open (`CallReader`, a base of
parsing.StreamParser): a JSON call object (`{"name": ..., "arguments": {...}}`, announced as soon
as its name is known when written name first) or a named call (`name[ARGS]{...}`, Mistral's newer
tokenizers: `_scan_named`), each call's arguments streamed as they arrive and its segment kept
with the region text it came from.

The reader's state (buffer, region text, current object and call, ids, segments, output) is set
by StreamParser.__init__; ending a region (`_end_region`) is the parser's.
Invariants: a call is announced (`CallStart`) once its name is known; arguments text is exactly
the JSON of the arguments value; a name before the arguments marker is at most MAX_NAME_CHARS.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from localpaged.chat.tools.spec import ToolCall
from localpaged.chat.tools.syntax import (
    ArgsDelta,
    CallStart,
    Delta,
    JsonScanner,
    Syntax,
    held_marker,
    name_and_args,
)

MAX_NAME_CHARS = 256             # a name (and call id) before the arguments marker, at most
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_NAME_PART = re.compile(r"[A-Za-z0-9_.\-\[\]]*")   # what may still become name[CALL_ID]id
_CALL_ID = "[CALL_ID]"
_NAME_FIRST = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(arguments|parameters)"'
                         r'\s*:\s*', re.S)


@dataclass
class Call:
    """A call being read: its raw text, and what was announced of it."""
    index: int | None = None            # set once announced
    name: str = ""
    args: str = ""                      # the arguments text as streamed
    raw: str = ""                       # the region text it came from (for parse's fallback)
    args_scanner: JsonScanner | None = None
    args_done: bool = False


@dataclass
class Segment:
    """One piece of the reply: text, or a call with the region text it came from."""
    text: str | None = None
    call: ToolCall | None = None
    raw: str = ""


class CallReader:
    """StreamParser's reading of one call (its state is set by StreamParser.__init__)."""
    syntax: Syntax
    _new_id: Callable[[], str]
    _buf: str                           # text not yet decided
    _region: str | None                 # None: in text; else the region's raw text so far
    _raw_from: int                      # where the current call's text starts in the region
    _state: str
    _obj: str                           # the current call object's text
    _scanner: JsonScanner
    _call: Call
    _announced_in_region: bool
    _ids: list[str]
    segments: list[Segment]
    _out: list[Delta]
    _end_region: Callable[[bool], None]  # StreamParser's: back to text (complete or not)

    def _scan_named(self, final: bool) -> bool:
        """`name[ARGS]{...}` after the opener: the name up to the marker (an optional
        `[CALL_ID]id` dropped), announced at the arguments' first brace, whose text then
        streams as it comes; False when waiting for more input."""
        marker = self.syntax.args_marker
        if self._state in ("open", "name"):
            self._state = "name"
            at = self._buf.find(marker)
            if at < 0:
                head = self._buf[:len(self._buf) - held_marker(self._buf, (marker,))]
                if final or not _NAME_PART.fullmatch(head) or len(head) > MAX_NAME_CHARS:
                    self._end_region(complete=False)
                    return True
                return False
            written, self._buf = self._buf[:at], self._buf[at + len(marker):]
            self._region += written + marker
            name = written.split(_CALL_ID, 1)[0]
            if not _NAME.fullmatch(name):
                self._end_region(complete=False)
                return True
            self._call, self._obj, self._state = Call(name=name), "", "args"
            return True
        call = self._call
        if call.index is None:                       # before the arguments' first brace
            stripped = self._buf.lstrip()
            self._region += self._buf[:len(self._buf) - len(stripped)]
            self._buf = stripped
            if not stripped:
                if final:
                    self._end_region(complete=False)
                return final
            if stripped[0] != "{":
                self._end_region(complete=False)
                return True
            self._announce(call.name)
            call.args_scanner = JsonScanner()
        while self._buf and not call.args_done:
            ch = self._take_char()
            self._obj += ch
            self._args_char(ch)
        if call.args_done:
            self._call_done()
        return True

    def _take_char(self) -> str:
        ch, self._buf = self._buf[0], self._buf[1:]
        self._region += ch
        return ch

    def _start_object(self) -> None:
        self._state = "object"
        self._obj = "{"
        self._scanner = JsonScanner()
        self._scanner.step("{")
        self._call = Call()

    def _object_char(self, ch: str) -> None:
        self._obj += ch
        call = self._call
        if call.args_scanner is not None and not call.args_done:
            self._args_char(ch)
        done = self._scanner.step(ch)
        if call.index is None and not done:
            m = _NAME_FIRST.fullmatch(self._obj)
            if m:
                try:
                    name = json.loads(f'"{m.group(1)}"')
                except json.JSONDecodeError:
                    name = None
                if name:
                    self._announce(name)
                    call.args_scanner = JsonScanner()
        if done:
            self._object_done()

    def _args_char(self, ch: str) -> None:
        """One character of the announced call's arguments: streamed (leading whitespace
        dropped) until its JSON value ends."""
        call = self._call
        if call.args_scanner.started or not ch.isspace():
            call.args += ch
            self._out.append(ArgsDelta(call.index, ch))
        call.args_done = call.args_scanner.step(ch)

    def _announce(self, name: str) -> None:
        index = len(self._ids)
        self._ids.append(self._new_id())
        self._call.index, self._call.name = index, name
        self._announced_in_region = True
        self._out.append(CallStart(index, self._ids[index], name))

    def _object_done(self) -> None:
        call = self._call
        try:
            obj = json.loads(self._obj)
        except json.JSONDecodeError:
            obj = None
        name, args = name_and_args(obj)
        if call.index is None:
            if name is None or args is None:
                self._end_region(complete=False)
                return
            self._announce(name)
            call.args = json.dumps(args, ensure_ascii=False)
            self._out.append(ArgsDelta(call.index, call.args))
        self._call_done()

    def _call_done(self) -> None:
        """The current call is whole: its segment (with the region text it came from), then
        what follows a call."""
        call = self._call
        self.segments.append(Segment(call=ToolCall(self._ids[call.index], call.name, call.args),
                                      raw=self._region[self._raw_from:]))
        self._raw_from = len(self._region)
        self._state = "after"
