"""Finding tool calls in a model's reply, incrementally: `StreamParser.feed(delta)` returns what
can be told apart so far (text, the start of a call with its id and name, fragments of its
arguments), `finish()` the rest. `parse(text)` is the same machine over the whole text, so a
reply parses the same however it was streamed.

A family's `Syntax` says how its calls are written:
- a call region opens with a consumed marker (`<tool_call>`, `[TOOL_CALLS]`, `<|python_tag|>`)
  or with text that is already part of the call (Llama's `{"name"`; Mistral's `[{"name"` when
  the tokenizer dropped its special `[TOOL_CALLS]` token while detokenizing);
- the region holds one JSON object per call (`{"name": ..., "arguments": {...}}`) or, for
  Mistral, a JSON array of them, and Hermes closes it with `</tool_call>`; or, for Mistral's
  newer tokenizers, the name up to `[ARGS]` and then the arguments' object. Reading one call
  (either form) is call_reading.CallReader's, a base of StreamParser; the regions and the text
  around them are here.

Invariants of the parser:
- Text is held back only while it may still be the start of a marker, or while it is whitespace
  right before a call (dropped if a call follows, so content is not padded with newlines).
- A call is announced (`CallStart`) once its name is known: at once when the object is written
  name first (`{"name": "f", "arguments": ...`: the arguments then stream as they arrive), else
  when the whole object is read. Arguments text is exactly the JSON of the arguments value.
- A region that turns out not to be a call (no object, no name, not JSON) goes out as text,
  unless a call of it was already announced. `parse` also turns a call whose arguments are not
  a JSON object back into its text: in a streamed reply such a call has already gone out.
"""

from __future__ import annotations

from collections.abc import Callable

from localpaged.chat.tools.call_reading import CallReader, Call, Segment
from localpaged.chat.tools.spec import ParsedReply, ToolCall
from localpaged.chat.tools.syntax import (
    ArgsDelta,
    CallStart,
    Delta,
    JsonScanner,
    Syntax,
    TextDelta,
    held_marker,
    is_object,
    merged,
)

__all__ = ["ArgsDelta", "CallStart", "Delta", "StreamParser", "Syntax", "TextDelta", "parse"]

MAX_REGION_CHARS = 1 << 20       # a call region longer than this is given up as text


class StreamParser(CallReader):
    def __init__(self, syntax: Syntax, new_id: Callable[[], str]) -> None:
        self.syntax = syntax
        self._new_id = new_id
        self._markers = syntax.openers + syntax.inline
        self._buf = ""                  # text not yet decided
        self._pending_ws = ""           # whitespace held after text (dropped before a call)
        self._after_call = False        # at whitespace that follows a call
        self._dropped_ws = ""           # the whitespace before the open region
        self._raw_from = 0              # where the current call's text starts in the region
        self._any_text = False          # whether any content went out
        self._region: str | None = None    # None: in text; else the region's raw text so far
        self._state = "text"
        self._obj = ""                  # the current call object's text
        self._scanner = JsonScanner()
        self._call = Call()
        self._announced_in_region = False
        self._ids: list[str] = []
        self.segments: list[Segment] = []
        self._out: list[Delta] = []

    # ---- public -----------------------------------------------------------------------------
    def feed(self, delta: str) -> list[Delta]:
        self._buf += delta
        self._run(final=False)
        return self._take()

    def finish(self) -> list[Delta]:
        self._run(final=True)
        if self._state != "text":
            self._end_region(complete=False)
        self._flush_text(self._buf, final=True)
        self._buf = ""
        if self._pending_ws and not self._after_call:
            self._emit_text(self._pending_ws)
        self._pending_ws = ""
        return self._take()

    # ---- the machine ------------------------------------------------------------------------
    def _take(self) -> list[Delta]:
        out, self._out = merged(self._out), []
        return out

    def _run(self, final: bool) -> None:
        while self._buf:
            if self._state == "text":
                if not self._scan_text(final):
                    return
            elif not self._scan_region(final):
                return

    def _scan_text(self, final: bool) -> bool:
        """Move text out up to the next marker; False when waiting for more input."""
        buf = self._buf
        hits = [(buf.find(m), m) for m in self._markers if m in buf]
        if hits:
            at, marker = min(hits, key=lambda h: (h[0], -len(h[1])))
            self._flush_text(buf[:at], final=False)
            self._dropped_ws, self._pending_ws = self._pending_ws, ""   # restored if no call
            consumed = marker if marker in self.syntax.openers else ""
            self._buf = buf[at + len(consumed):]
            self._open_region(consumed)
            return True
        keep = 0 if final else held_marker(buf, self._markers)
        self._flush_text(buf[:len(buf) - keep], final=False)
        self._buf = buf[len(buf) - keep:]
        return False

    def _flush_text(self, text: str, final: bool) -> None:
        if not text:
            return
        if self._after_call:
            # Whitespace after a call is dropped, or kept as the break between two texts.
            rest = text.lstrip(" \t\r\n" + self.syntax.separators)
            if not rest:
                return
            self._after_call = False
            gap = text[:len(text) - len(rest)]
            text = (gap.strip(self.syntax.separators) or "\n") + rest if self._any_text else rest
        stripped = text.rstrip()
        if stripped:
            self._emit_text(self._pending_ws + stripped)
            self._pending_ws = ""
        self._pending_ws += text[len(stripped):]

    def _emit_text(self, text: str) -> None:
        self._any_text = True
        self._out.append(TextDelta(text))
        if self.segments and self.segments[-1].text is not None:
            self.segments[-1].text += text
        else:
            self.segments.append(Segment(text=text))

    def _open_region(self, consumed: str) -> None:
        self._region = consumed
        self._raw_from = 0
        self._announced_in_region = False
        self._state = "open"

    def _scan_region(self, final: bool) -> bool:
        while self._buf:
            if len(self._region) > MAX_REGION_CHARS:
                self._end_region(complete=False)
                return True
            ch = self._buf[0]
            if self.syntax.args_marker and self._state in ("open", "name", "args"):
                if not self._scan_named(final):
                    return False
            elif self._state in ("open", "next"):
                if ch.isspace():
                    self._take_char()
                    continue
                want = "[" if self._state == "open" and self.syntax.array else "{"
                if ch != want:
                    self._end_region(complete=False)
                    return True
                self._take_char()
                if want == "{":
                    self._start_object()
                else:
                    self._state = "next"
            elif self._state == "object":
                self._take_char()
                self._object_char(ch)
            elif self._state == "after":
                if not self._after_object(final):
                    return False
            if self._state == "text":
                return True
        return False

    def _after_object(self, final: bool) -> bool:
        """After a call object: the closer, the next object of an array, or text."""
        s = self.syntax
        stripped = self._buf.lstrip()
        if not stripped and not final:
            return False
        if s.array:
            if stripped[:1] in (",", "]"):
                self._buf = stripped[1:]
                self._region += stripped[:1]
                if stripped[0] == ",":
                    self._state = "next"
                else:
                    self._end_region(complete=True)
                return True
        elif s.closer:
            if stripped.startswith(s.closer):
                self.segments[-1].raw += self._buf[:len(self._buf) - len(stripped)] + s.closer
                self._buf = stripped[len(s.closer):]
                self._end_region(complete=True)
                return True
            if s.closer.startswith(stripped) and not final:
                return False
        self._end_region(complete=True)
        return True

    def _end_region(self, complete: bool) -> None:
        """Back to text. A region without an announced call goes out as text; an unfinished
        call that was announced stays a call (its text is gone to the client already)."""
        region, self._region = self._region or "", None
        current = self._obj if self._state in ("object", "args") else ""
        self._state = "text"
        if not self._announced_in_region:
            # Not a call: the region's text is content, and scanning goes on after its marker
            # (or its first character), so a real call later in the text is still found.
            marker = next((m for m in self.syntax.openers if m and region.startswith(m)), "")
            cut = len(marker) or 1
            self._pending_ws, self._dropped_ws = self._dropped_ws, ""
            self._flush_text(region[:cut], final=False)
            self._buf = region[cut:] + self._buf
            return
        self._after_call = True
        if current and self._call.index is not None:      # announced, cut off
            self.segments.append(Segment(call=ToolCall(
                self._ids[self._call.index], self._call.name, self._call.args),
                raw=region[self._raw_from:]))
        elif current:                   # an object that is no call, after calls: text
            self._flush_text(current[:1], final=False)
            self._buf = current[1:] + self._buf

def parse(syntax: Syntax, new_id: Callable[[], str], text: str) -> ParsedReply:
    """The reply's content and calls; a call whose arguments are not a JSON object stays text."""
    parser = StreamParser(syntax, new_id)
    parser.feed(text)
    parser.finish()
    content, calls = [], []
    for seg in parser.segments:
        if seg.call is None:
            content.append(seg.text)
        elif is_object(seg.call.arguments):
            calls.append(seg.call)
        else:
            content.append(seg.raw)
    return ParsedReply("".join(content), calls)
