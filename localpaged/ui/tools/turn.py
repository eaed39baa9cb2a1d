"""A turn whose replies may call tools (`ToolTurn`): the model's reply is parsed for calls
(`backend.parse_reply`: only a model reply is ever parsed, never a tool's result, so a result
that contains call markup is only text), each call becomes a tool message (its card), waits for
the user's approval unless its tool is allowed, runs on its MCP server, and its result goes back
as a `role: "tool"` message; then the next reply is asked for in the same turn, up to the plan's
step limit (the step after the last allowed one is asked with tool_choice "none", so the turn
ends with an answer). Every step is a message of the tree: assistant (its `extra.tool_calls`),
tool (its `extra`: tool_call_id, name, arguments, state, duration_s, total_chars), so a
restart shows the cards, and each step's prompt is the previous prompt plus the new messages.

A tool message's `extra.state`: "waiting" (for approval), "running", "done", "error" (the
server's or the tool's), "denied", "stopped".
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator

from localpaged.chat.backend import reasoning_of
from localpaged.chat.tool_calls import ToolCall
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.outputs import RequestOutput

from ..context.logic import fit_prompt, prompt_messages
from ..settings.logic import sampling_record
from ..store import Store
from ..live_reply import LiveReply
from ..turns import ChatError, Turn
from .logic import ToolPlan
from .mcp_client import ToolError

DECISIONS = ("approve", "deny", "always")
DENIED = "The user did not allow this tool call."


def open_stream(backend, messages: list[dict], params: list[SamplingParams], request_id: str,
                plan: ToolPlan | None, choice: str) -> Iterator[RequestOutput]:
    """backend.chat with the plan's tools (when it has any) and `choice`."""
    if plan is None or not plan.specs:
        return backend.chat(messages, params, request_id=request_id)
    if not hasattr(backend, "parse_reply"):
        raise ChatError("tools need a backend that reads tool calls (the local engine)")
    return backend.chat(messages, params, request_id=request_id, tools=plan.specs,
                        tool_choice=choice)


class ToolTurn(Turn):
    """`replies` holds the current step's reply (earlier steps are stored); `pending` is the tool card waiting for the
    user (message_id, name, arguments) or None."""

    def __init__(self, conversation_id: int, request_id: str, reply: LiveReply,
                 stream: Iterator[RequestOutput], backend, store: Store, plan: ToolPlan,
                 params: list[SamplingParams], policy: str, on_done=None) -> None:
        super().__init__(conversation_id, request_id, [reply], stream, backend.abort, store,
                         on_done=on_done, reasoning=reasoning_of(backend))
        self._backend, self._plan, self._params, self._policy = backend, plan, params, policy
        self.pending: dict | None = None
        self._decision: str | None = None

    # ---- the user's side ----------------------------------------------------------------------
    def decide(self, choice: str) -> bool:
        """Answer the waiting call ("approve", "deny", "always"); False if none waits."""
        if choice not in DECISIONS:
            raise ValueError(f"a decision is one of {list(DECISIONS)}, got {choice!r}")
        with self._cond:
            if self.pending is None:
                return False
            self._decision = choice
            self._cond.notify_all()
        return True

    def stop(self) -> None:
        super().stop()
        with self._cond:
            self._cond.notify_all()          # an approval wait ends

    # ---- the turn's thread ----------------------------------------------------------------------
    def _run(self) -> None:
        steps = 0
        try:
            while True:
                out = self._consume()
                reply = self.replies[-1]
                calls = self._calls(reply, allowed=steps < self._plan.max_steps)
                extra = {"tool_calls": [dataclasses.asdict(c) for c in calls]} if calls else None
                self._save_replies(out, [reply], extra)
                if not calls or self._stopped():
                    break
                steps += 1
                parent = reply.message_id
                for call in calls:
                    parent = self._call(call, parent)
                if self._stopped():
                    break
                choice = "auto" if steps < self._plan.max_steps else "none"
                self._next_step(parent, choice)
        except Exception as exc:  # noqa: BLE001 - shown to the user; what is stored stays
            self.error = self.error or str(exc) or type(exc).__name__
        self._end()

    def _stopped(self) -> bool:
        return self._stop.is_set() or self.error is not None

    def _calls(self, reply: LiveReply, allowed: bool) -> list[ToolCall]:
        """The calls of a finished reply (its text becomes the reply's own text); none when
        stopped, failed, or past the step limit."""
        if self._stopped() or not allowed:
            return []
        parsed = self._backend.parse_reply(reply.text)
        if parsed.tool_calls:
            reply.text = parsed.content
        return list(parsed.tool_calls)

    def _bump(self) -> None:
        with self._cond:
            self.version += 1
            self._cond.notify_all()

    def _call(self, call: ToolCall, parent: int) -> int:
        """One call's card: stored, approved (or not), run, its result stored; returns the
        tool message's id (the next step's parent)."""
        card = {"tool_call_id": call.id, "name": call.name, "arguments": call.arguments}
        msg = self._store.add_message(self.conversation_id, parent, "tool", "",
                                      status="streaming", extra={**card, "state": "waiting"})
        self._bump()
        state, text, extra = self._approve(call, msg.id)
        if state == "approved":
            self._store.update_message(msg.id, extra={"state": "running"})
            self._bump()
            start = time.monotonic()
            try:
                result = self._plan.run(call)
                state, text = ("error" if result.is_error else "done"), result.text
                extra = {"total_chars": result.total_chars}
            except ToolError as exc:
                state, text = "error", f"Error: {exc}"
            extra["duration_s"] = round(time.monotonic() - start, 3)
        status = "stopped" if state == "stopped" else "complete"
        self._store.update_message(msg.id, content=text, status=status,
                                   extra={**extra, "state": state})
        self._bump()
        return msg.id

    def _approve(self, call: ToolCall, message_id: int) -> tuple[str, str, dict]:
        """("approved", "", {}) when the call may run; else its final state and text."""
        if call.name in self._plan.allowed:
            return "approved", "", {}
        with self._cond:
            self.pending, self._decision = {"message_id": message_id, "name": call.name,
                                            "arguments": call.arguments}, None
            self.version += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._decision is not None or self._stop.is_set())
            decision, self.pending = self._decision, None
        if decision is None:
            return "stopped", "", {}
        if decision == "deny":
            return "denied", DENIED, {}
        if decision == "always":
            self._plan.allowed.add(call.name)
            if self._plan.allow is not None:
                self._plan.allow(call.name)
        return "approved", "", {}

    def _next_step(self, parent: int, choice: str) -> None:
        """The next reply's request, over the path down to the last tool message."""
        cid = self.conversation_id
        sent = fit_prompt(self._backend, prompt_messages(self._store, cid, parent),
                          self._params[0].max_tokens, self._policy)
        request_id = f"conv{cid}-{uuid.uuid4().hex[:8]}"
        stream = open_stream(self._backend, sent.messages, self._params, request_id,
                             self._plan, choice)
        stats = {"context_dropped": sent.dropped} if sent.dropped else {}
        if getattr(self._backend, "model_name", None):
            stats["model"] = self._backend.model_name
        msg = self._store.add_message(cid, parent, "assistant", "",
                                      sampling_record(self._params[0]), status="streaming",
                                      stats=stats)
        with self._cond:
            self.request_id, self._stream = request_id, stream
            self._first_token.clear()
            self.started = time.monotonic()
            self.replies = [LiveReply(msg.id)]      # earlier steps are read from the store
            self.version += 1
            self._cond.notify_all()

