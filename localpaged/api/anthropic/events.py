"""One reply as Anthropic content blocks and streaming events, built from the engine's outputs.

`Reply` is fed a request's outputs (deltas, in order) and gives back the events that each adds:

    message_start, ping                             (start(): before the first token)
    content_block_start / content_block_delta* / content_block_stop   per block, in order
    message_delta (stop_reason, stop_sequence, usage.output_tokens), message_stop   (finish())

Text arrives as `text_delta`s of a `text` block; a tool call as a `tool_use` block whose input
arrives as `input_json_delta`s (`partial_json`, which joined are its JSON arguments). A streamed
response sends the events as they come (`sse()` writes one); a whole response feeds the same
outputs and returns `message()`, so both carry the same blocks. Which text is a tool call is the
tool format's stream parser's business (chat/tool_calls.py); without tools, all text is text.

stop_reason: "tool_use" when the reply called a tool, "max_tokens" when it ran out of tokens,
"stop_sequence" (with `stop_sequence`) when a stop sequence ended it, else "end_turn".
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from localpaged.engine.outputs import RequestOutput


def sse(event: dict) -> str:
    """One server-sent event, named by its type as Anthropic names them."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class Reply:
    """The blocks of one reply, from the engine's outputs of a one-sample request.

    `parser`: a tool format's stream parser (`feed(text) -> deltas`, `finish() -> deltas`, each
    delta a text piece or a tool call's piece), or None when no tool can be called.
    """

    def __init__(self, message_id: str, model: str, input_tokens: int,
                 stop_sequences: list[str] | None = None, parser: Any = None) -> None:
        self.id, self.model, self.input_tokens = message_id, model, input_tokens
        self.stop_sequences = set(stop_sequences or ())
        self.parser = parser
        self.blocks: list[dict] = []            # the content so far; tool inputs as JSON text
        self._open: dict | None = None          # the block being streamed
        self._tool_keys: dict[Any, dict] = {}   # a parser's key of a call -> its block
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
        if o.finish_reason is not None:
            self.finish_reason = o.finish_reason
            self.stop_string = o.stop_reason if isinstance(o.stop_reason, str) else None
        if not o.text:
            return []
        if self.parser is None:
            return self._text(o.text)
        return self._parsed(self.parser.feed(o.text))

    def finish(self) -> list[dict]:
        """The events that end the message (after the last output)."""
        events = self._parsed(self.parser.finish()) if self.parser is not None else []
        events += self._close()
        reason, sequence = self.stop_reason()
        return events + [{"type": "message_delta",
                          "delta": {"stop_reason": reason, "stop_sequence": sequence},
                          "usage": self.usage()},
                         {"type": "message_stop"}]

    # ---- the whole message --------------------------------------------------------------------
    def message(self) -> dict:
        reason, sequence = self.stop_reason()
        return {**self._head(), "content": [_final(b) for b in self.blocks],
                "stop_reason": reason, "stop_sequence": sequence, "usage": self.usage()}

    def usage(self) -> dict:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    def stop_reason(self) -> tuple[str, str | None]:
        if any(b["type"] == "tool_use" for b in self.blocks):
            return "tool_use", None
        if self.finish_reason == "length":
            return "max_tokens", None
        if self.stop_string is not None and self.stop_string in self.stop_sequences:
            return "stop_sequence", self.stop_string
        return "end_turn", None

    # ---- blocks -------------------------------------------------------------------------------
    def _head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def _text(self, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open["type"] != "text":
            events += self._close() + self._begin({"type": "text", "text": ""})
        self._open["text"] += text
        return events + [self._delta({"type": "text_delta", "text": text})]

    def _tool(self, key: Any, name: str | None, call_id: str | None,
              arguments: str) -> list[dict]:
        events = []
        block = self._tool_keys.get(key)
        if block is None:
            block = {"type": "tool_use", "id": call_id or new_id("toolu"), "name": name or "",
                     "input": ""}
            self._tool_keys[key] = block
            events += self._close() + self._begin(block)
        if arguments:
            block["input"] += arguments
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def _parsed(self, deltas: list) -> list[dict]:
        events = []
        for d in deltas:
            if d.kind == "text":
                events += self._text(d.text)
            else:
                events += self._tool(d.index, d.name, d.id, d.arguments or "")
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


def _final(block: dict) -> dict:
    """A block as the whole response carries it: a tool's input parsed from its JSON text."""
    if block["type"] != "tool_use":
        return dict(block)
    text = block["input"].strip()
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        value = {"_raw": text}
    return {**block, "input": value if isinstance(value, dict) else {"_value": value}}
