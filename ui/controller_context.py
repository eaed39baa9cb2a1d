"""The context features of the chat controller (a mixin of `ChatController`): the
per-conversation context policy, the gauge's numbers (`context_usage`) and Continue
(`continue_reply`). The policy and counting rules live in `context.py`; this is where they meet
the store and the backend. `ChatError` and `chat_prompt` live here so both halves share them.
"""

from __future__ import annotations

import uuid

from localpaged.chat.backend import ChatBackend
from localpaged.engine.outputs import NATURAL_ENDS

from . import context
from .context import ContextUsage
from .generation import LiveReply, Turn
from .store import Conversation, Message


class ChatError(Exception):
    """Something the user asked for that cannot be done now; the message says why."""


class ContextFeatures:
    """Needs the controller's store, backend(), settings(), prompt_messages(), _params() and
    _launch()."""

    def set_context_policy(self, cid: int, policy: str) -> Conversation:
        """What a send does when the conversation no longer fits: "drop_oldest" | "error"
        (ValueError naming the choices otherwise)."""
        conv = self.store.get_conversation(cid)
        if conv.context_policy == policy:
            return conv
        return self.store.update_conversation(cid, context_policy=policy)

    def context_usage(self, cid: int, draft: str = "", system_prompt: str | None = None,
                      max_tokens: int | None = None) -> ContextUsage | None:
        """The gauge: tokens the next request will use (the system prompt, the shown path and
        the draft) against the context limit; None when the backend cannot count (remote,
        no model yet). `system_prompt`, `max_tokens`: the fields as shown (default: saved)."""
        backend = self.backend()
        if backend is None:
            return None
        conv = self.store.get_conversation(cid)
        system = conv.system_prompt if system_prompt is None else system_prompt
        msgs = chat_prompt(system, self.store.active_path(cid))
        max_tokens = max_tokens or self.settings(cid)[1]["max_tokens"]
        return context.usage(backend, msgs, draft, max_tokens, conv.context_policy)

    def continue_reply(self, message_id: int) -> Turn:
        """Extend a reply that stopped before its natural end, in place: the engine resumes
        from the reply's stored tokens (its prompt's blocks are found in the prefix cache) and
        writes up to max_tokens (the conversation's setting) more into the same message. A
        reply that filled the context goes on with older turns left out (policy drop_oldest;
        the reply's `context_dropped` follows)."""
        m = self.store.get_message(message_id)
        if m.role != "assistant":
            raise ChatError("only a reply can be continued: select one")
        if m.status == "complete" and m.stats.get("finish_detail") in NATURAL_ENDS:
            raise ChatError("this reply ended naturally: there is nothing to continue")
        if self.store.children(m.id):
            raise ChatError("this reply has messages after it: fork here, then continue it")
        cid = m.conversation_id
        params = self._params(cid, 1)[0]

        def start(backend: ChatBackend) -> Turn:
            msgs = self.prompt_messages(cid, m.parent_id)
            req, dropped = context.continue_prompt(
                backend, msgs, int(m.stats.get("context_dropped", 0)), m.token_ids or [],
                params, self.store.get_conversation(cid).context_policy)
            request_id = f"conv{cid}-{uuid.uuid4().hex[:8]}"
            stream = backend.submit_ids(req.prompt_token_ids, req.params, request_id)
            m.stats["context_dropped"] = dropped
            try:
                self.store.update_message(m.id, status="streaming",
                                          stats={"context_dropped": dropped})
                self.store.set_active(m.id)
            except BaseException:
                backend.abort(request_id)
                raise
            reply = LiveReply(m.id, m.content, stats=dict(m.stats), token_ids=m.token_ids,
                              prefix_ids=list(m.token_ids))
            return Turn(cid, request_id, [reply], stream, backend.abort, self.store,
                        decode=backend.decode)
        return self._launch(cid, start)


def chat_prompt(system_prompt: str, path: list[Message]) -> list[dict[str, str]]:
    """The engine's chat messages for a path: the system prompt (if any), then the path."""
    msgs = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return msgs + [{"role": m.role, "content": m.content} for m in path]
