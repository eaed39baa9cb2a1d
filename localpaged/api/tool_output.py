"""A chat reply with tools, in OpenAI's shape: the whole message, or its stream of deltas.

`ToolReplies(fmt, n)` belongs to one Generation that offered tools; each of its n choices has
its own stream parser (chat/tool_calls.py), so calls are found the same way streamed or not.
- `message(text)`: {"role": "assistant", "content": text or None, "tool_calls": [...]}.
- `deltas(i, text)` / `finish(i)`: the choice's stream deltas, in order: content text, a call's
  first delta (index, id, type, function.name, empty arguments), then its arguments fragments.
- `rows(...)`, `chunk_rows(rows)`: those deltas as stream choice entries, packed into chunks.
- `finish_reason(i, reason)`: "tool_calls" where the choice made a call and stopped on its own
  (a reply cut by max_tokens keeps "length").
"""

from __future__ import annotations

from localpaged.chat.tool_calls import ArgsDelta, CallStart, Delta, TextDelta, ToolFormat


class ToolReplies:
    def __init__(self, fmt: ToolFormat, n: int) -> None:
        self.fmt = fmt
        self._parsers = [fmt.stream_parser() for _ in range(n)]
        self._called = [False] * n

    def message(self, text: str) -> tuple[dict, bool]:
        """(the assistant message of a whole reply, whether it made calls)."""
        reply = self.fmt.parse(text)
        msg: dict = {"role": "assistant", "content": reply.content or None}
        if reply.tool_calls:
            msg["tool_calls"] = [c.openai() for c in reply.tool_calls]
        else:
            msg["content"] = text           # no call: the reply exactly as written
        return msg, bool(reply.tool_calls)

    def deltas(self, i: int, text: str, done: bool) -> list[dict]:
        """The choice's deltas for new text (and the parser's rest once it is done)."""
        parser = self._parsers[i]
        out = parser.feed(text) if text else []
        if done:
            out += parser.finish()
        return [self._delta(i, d) for d in out]

    def _delta(self, i: int, d: Delta) -> dict:
        if isinstance(d, TextDelta):
            return {"content": d.text}
        self._called[i] = True
        if isinstance(d, CallStart):
            return {"tool_calls": [{"index": d.index, "id": d.id, "type": "function",
                                    "function": {"name": d.name, "arguments": ""}}]}
        assert isinstance(d, ArgsDelta)
        return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}

    def finish_reason(self, i: int, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self._called[i] else reason

    def rows(self, i: int, text: str, done: bool, lps: dict | None,
             reason: str | None) -> list[dict]:
        """Stream choice entries for choice i's new text: one per delta (a call's first delta
        stands alone, as OpenAI sends it); logprobs and the finish reason on the last."""
        deltas = self.deltas(i, text, done)
        if not deltas and (lps or done):
            deltas = [{}]
        rows = [{"index": i, "delta": d, "logprobs": None, "finish_reason": None}
                for d in deltas]
        if rows:
            rows[-1]["logprobs"] = lps
            rows[-1]["finish_reason"] = self.finish_reason(i, reason)
        return rows


def chunk_rows(rows: list[dict]) -> list[list[dict]]:
    """Choice entries packed into chunks, at most one per choice index in a chunk, in order."""
    chunks: list[list[dict]] = []
    depth: dict[int, int] = {}
    for row in rows:
        k = depth.get(row["index"], 0)
        depth[row["index"]] = k + 1
        if k == len(chunks):
            chunks.append([])
        chunks[k].append(row)
    return chunks
