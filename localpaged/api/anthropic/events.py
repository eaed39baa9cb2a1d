"""One reply as Anthropic content blocks and streaming events, built from the engine's outputs.

`Reply` is fed a request's outputs (deltas, in order) and gives back the events that each adds:

    message_start, ping                             (start(): before the first token)
    content_block_start / content_block_delta* / content_block_stop   per block, in order
    message_delta (stop_reason, stop_sequence, usage.output_tokens), message_stop   (finish())

A reasoning model's reasoning (chat/reasoning.py splits it from the answer) comes first, as a
`thinking` block whose text arrives as `thinking_delta`s; its `signature` is "" (this server
signs nothing; Anthropic's clients keep and send back whatever it is), and no `signature_delta`
is sent. Text arrives as `text_delta`s of a `text` block; a tool call as a `tool_use` block
whose input arrives as `input_json_delta`s (`partial_json`, which joined are its JSON
arguments). A streamed
response sends the events as they come (`sse()` writes one); a whole response feeds the same
outputs and returns `message()`. Which text is a tool call is the tool format's stream parser's
business (chat/tool_calls.py), run on the deltas for events and on the whole text for
`message()`, so both find the same calls in the same order; without tools, all text is text.
Call ids are Anthropic's (`toolu_...`), whatever the format's own.

stop_reason: "tool_use" when the reply called a tool, "max_tokens" when it ran out of tokens,
"stop_sequence" (with `stop_sequence`) when a stop sequence ended it, else "end_turn".
"""

from __future__ import annotations

import json
import uuid

from localpaged.chat.reasoning import ReasoningFormat, Split
from localpaged.chat.tool_calls import CallStart, Delta, TextDelta, ToolFormat
from localpaged.engine.outputs import RequestOutput


def sse(event: dict) -> str:
    """One server-sent event, named by its type as Anthropic names them."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class Reply:
    """The blocks of one reply, from the engine's outputs of a one-sample request.

    `fmt`: the tool format whose calls the reply may hold (chat/tool_calls.ToolFormat), or None
    when no tool is offered. `streamed`: whether `feed` makes events (else it only keeps the
    text, which `message()` reads). `reasoning`: the model's reasoning format (None: it marks
    none), whose split starts where `prompt_ids` left the reply.
    """

    def __init__(self, message_id: str, model: str, input_tokens: int,
                 stop_sequences: list[str] | None = None, fmt: ToolFormat | None = None,
                 streamed: bool = True, reasoning: ReasoningFormat | None = None,
                 prompt_ids: list[int] | None = None) -> None:
        self.id, self.model, self.input_tokens = message_id, model, input_tokens
        self.stop_sequences = set(stop_sequences or ())
        self.fmt, self.streamed = fmt, streamed
        self.parser = fmt.stream_parser() if fmt is not None and streamed else None
        self.reasoning, self.prompt_ids = reasoning, list(prompt_ids or [])
        self.thoughts = reasoning.parser(self.prompt_ids) if reasoning and streamed else None
        self.text = ""                          # the reply as the model wrote it
        self.blocks: list[dict] = []            # the streamed blocks; tool inputs as JSON text
        self._open: dict | None = None          # the block being streamed
        self._calls: dict[int, dict] = {}       # a call's index in the reply -> its block
        self.output_tokens = 0
        self.finish_reason: str | None = None
        self.stop_string: str | None = None

    # ---- events -------------------------------------------------------------------------------
    def start(self) -> list[dict]:
        message = {**self._head(), "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def feed(self, out: RequestOutput) -> list[dict]:
        """The events of one output (a delta: only what is new)."""
        (o,) = out.outputs
        self.output_tokens += len(o.token_ids)
        self.text += o.text
        if o.finish_reason is not None:
            self.finish_reason = o.finish_reason
            self.stop_string = o.stop_reason if isinstance(o.stop_reason, str) else None
        if not (o.text and self.streamed):
            return []
        return self._split(self.thoughts.feed(o.text)) if self.thoughts else self._answer(o.text)

    def finish(self) -> list[dict]:
        """The events that end the message (after the last output)."""
        events = self._split(self.thoughts.finish()) if self.thoughts is not None else []
        events += self._deltas(self.parser.finish()) if self.parser is not None else []
        events += self._close()
        reason, sequence = self.stop_reason(self.blocks)
        return events + [{"type": "message_delta",
                          "delta": {"stop_reason": reason, "stop_sequence": sequence},
                          "usage": self.usage()},
                         {"type": "message_stop"}]

    # ---- the whole message --------------------------------------------------------------------
    def message(self) -> dict:
        """The whole reply as one message (its text split and parsed for calls once, at the
        end)."""
        split = self.reasoning.split(self.text, self.prompt_ids) if self.reasoning \
            else Split(content=self.text)
        content = self._parsed(split.content)
        if split.reasoning:
            content.insert(0, {"type": "thinking", "thinking": split.reasoning, "signature": ""})
        reason, sequence = self.stop_reason(content)
        return {**self._head(), "content": content, "stop_reason": reason,
                "stop_sequence": sequence, "usage": self.usage()}

    def usage(self) -> dict:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    def stop_reason(self, blocks: list[dict]) -> tuple[str, str | None]:
        if self.finish_reason == "length":
            return "max_tokens", None
        if any(b["type"] == "tool_use" for b in blocks):
            return "tool_use", None
        if self.stop_string is not None and self.stop_string in self.stop_sequences:
            return "stop_sequence", self.stop_string
        return "end_turn", None

    def _parsed(self, text: str) -> list[dict]:
        """The answer's blocks in the order written: the stream parser's segments, read as
        `parse` reads them (a call whose arguments are not a JSON object stays text), but
        keeping text after a call after it."""
        if self.fmt is None:
            return [{"type": "text", "text": text}] if text else []
        parser = self.fmt.stream_parser()
        parser.feed(text)
        parser.finish()
        blocks: list[dict] = []
        for seg in parser.segments:
            value = _object(seg.call.arguments) if seg.call is not None else None
            if value is not None:
                blocks.append({"type": "tool_use", "id": new_id("toolu"), "name": seg.call.name,
                               "input": value})
                continue
            text = seg.text if seg.call is None else seg.raw
            if blocks and blocks[-1]["type"] == "text":
                blocks[-1]["text"] += text
            elif text:
                blocks.append({"type": "text", "text": text})
        if not any(b["type"] == "tool_use" for b in blocks):     # the reply exactly as written
            return [{"type": "text", "text": text}] if text else []
        return blocks

    # ---- streamed blocks ----------------------------------------------------------------------
    def _head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def _split(self, split: Split) -> list[dict]:
        """A split delta's events: its reasoning (always before any answer), then its answer."""
        events = []
        if split.reasoning:
            if self._open is None or self._open["type"] != "thinking":
                events += self._close() + self._begin(
                    {"type": "thinking", "thinking": "", "signature": ""})
            self._open["thinking"] += split.reasoning
            events.append(self._delta({"type": "thinking_delta", "thinking": split.reasoning}))
        return events + (self._answer(split.content) if split.content else [])

    def _answer(self, text: str) -> list[dict]:
        return self._deltas(self.parser.feed(text)) if self.parser else self._text(text)

    def _text(self, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open["type"] != "text":
            events += self._close() + self._begin({"type": "text", "text": ""})
        self._open["text"] += text
        return events + [self._delta({"type": "text_delta", "text": text})]

    def _deltas(self, deltas: list[Delta]) -> list[dict]:
        events = []
        for d in deltas:
            if isinstance(d, TextDelta):
                events += self._text(d.text)
            elif isinstance(d, CallStart):
                block = {"type": "tool_use", "id": new_id("toolu"), "name": d.name, "input": ""}
                self._calls[d.index] = block
                events += self._close() + self._begin(block)
            else:
                self._calls[d.index]["input"] += d.text
                events.append(self._delta({"type": "input_json_delta", "partial_json": d.text}))
        return events

    def _begin(self, block: dict) -> list[dict]:
        self.blocks.append(block)
        self._open = block
        start = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        return [{"type": "content_block_start", "index": len(self.blocks) - 1,
                 "content_block": start}]

    def _delta(self, delta: dict) -> dict:
        return {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}

    def _close(self) -> list[dict]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]


def _object(arguments: str) -> dict | None:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
