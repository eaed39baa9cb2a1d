"""The conversation against the model's context window, in plain Python: the chat messages a
path makes (`chat_prompt`, `prompt_messages`), what the context gauge shows (`ContextUsage`),
which messages a request sends (`fit_prompt`, per-conversation policy "drop_oldest" | "error" |
"compact"; compaction itself is `compact.py`, which falls back to "drop_oldest" here),
the request that continues a reply stopped early (`continue_prompt`), and `ContextFeatures`,
where they meet the store and the backend: the policy setting, the gauge's numbers and Continue.
Thin over `localpaged.chat.context_window` and `localpaged.chat.continuation`.

Only a local backend has a context window (`backend.context_window()`); for a remote one every
function here answers "unknown" (None, or the messages unchanged) and the server decides.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from localpaged.chat.backend import ChatBackend, reasoning_of, with_thinking
from localpaged.chat.context_window import (
    DEFAULT_REPLY_RESERVE,
    ContextOverflowError,
    ContextWindow,
    SystemPromptTooLongError,
    split_turns,
)
from localpaged.chat.continuation import ContinueRequest, continue_request
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.outputs import NATURAL_ENDS

from ..images.logic import ImageSource
from ..settings.logic import ConversationSettings, Sampling
from ..store import Conversation, Message, Store
from ..tools.messages import message_dict
from ..turn_registry import TurnRegistry
from ..live_reply import LiveReply
from ..turns import ChatError, Turn

POLICY_LABELS = {"drop_oldest": "Drop the oldest messages (default)",
                 "error": "Stop and ask me",
                 "compact": "Compact: summarise the oldest turns into a new branch"}
# How a summary (a leading system-role message of a compacted branch) joins the system prompt.
SUMMARY_INTRO = "Summary of the earlier conversation:\n"
NEAR_LIMIT = 0.8           # the gauge turns amber from this share of the room for the prompt


class ContextError(ValueError):
    """A request that does not fit the context and that the policy will not shorten; the
    message says what to do."""


class ContextAsk(ContextError):
    """Policy "error" ("Stop and ask me") met a conversation that no longer fits, and leaving
    out the oldest `dropped` messages would make it fit: the UI asks the user what to do (send
    once with them left out, edit the message, or cancel). Nothing was sent or stored."""

    def __init__(self, message: str, dropped: int) -> None:
        super().__init__(message)
        self.dropped = dropped


@dataclass
class ContextUsage:
    """What the gauge shows for the next request of a conversation."""
    tokens: int           # system prompt + path + draft, exact (the chat template)
    limit: int            # the context limit: prompt + reply
    reserve: int          # room kept for the reply
    dropped: int          # messages the next request leaves out (policy drop_oldest)
    policy: str

    @property
    def room(self) -> int:
        """The most prompt tokens one request may send."""
        return self.limit - self.reserve

    @property
    def over(self) -> bool:
        return self.tokens > self.room

    @property
    def near(self) -> bool:
        return self.tokens >= NEAR_LIMIT * self.room


@dataclass
class Prompt:
    """What one request sends: the kept messages and how many were left out."""
    messages: list[dict]
    dropped: int


def window_of(backend) -> ContextWindow | None:
    get = getattr(backend, "context_window", None)
    return get() if get is not None else None


def reply_reserve(max_tokens: int | None, limit: int) -> int:
    """Room kept for the reply: max_tokens, but at most a quarter of the context, so a long
    max_tokens never leaves the prompt no room (such a reply may then stop at the limit)."""
    return max(1, min(max_tokens or DEFAULT_REPLY_RESERVE, limit // 4))


def usage(backend, messages: list[dict], draft: str, max_tokens: int | None,
          policy: str) -> ContextUsage | None:
    """The gauge for sending `draft` after `messages` (None: no local context window)."""
    window = window_of(backend)
    if window is None:
        return None
    reserve = reply_reserve(max_tokens, window.limit)
    tokens = window.count_tokens(messages, draft or None) if messages or draft else 0
    dropped = 0
    if tokens > window.limit - reserve and policy == "drop_oldest":
        draft_msg = [{"role": "user", "content": draft}] if draft else []
        try:
            dropped = window.fit(messages + draft_msg, reserve, policy).num_dropped
        except ContextOverflowError:
            dropped = 0                       # the send will say why
    return ContextUsage(tokens, window.limit, reserve, dropped, policy)


def fit_prompt(backend, messages: list[dict], max_tokens: int | None, policy: str) -> Prompt:
    """The messages to send so that the prompt and the reply's room fit the context; raises
    ContextError (nothing is sent, nothing should be stored) when they cannot."""
    window = window_of(backend)
    if window is None or not messages:
        return Prompt(messages, 0)
    reserve = reply_reserve(max_tokens, window.limit)
    if window.count_tokens(messages) + reserve <= window.limit:
        return Prompt(messages, 0)              # fits (a cached count: no second tokenizing)
    try:
        fit = window.fit(messages, reserve, window_policy(policy))
    except SystemPromptTooLongError as exc:
        raise ContextError(f"The system prompt is too long for this model's context: {exc}. "
                           "Shorten it in the conversation settings.") from exc
    except ContextOverflowError as exc:
        if policy == "error":
            why = (f"This conversation no longer fits the model's context ({exc}). Your "
                   "message was not sent. To go on, choose “Drop the oldest messages” in the "
                   "conversation settings, shorten your message, or fork from an earlier "
                   "message.")
            dropped = _dropped_to_fit(window, messages, reserve)
            if dropped is not None:
                raise ContextAsk(why, dropped) from exc
            raise ContextError(why) from exc
        raise ContextError(f"Your message is too long for the model's context: {exc}. "
                           "Shorten it and send again.") from exc
    return Prompt(fit.messages, fit.num_dropped)


def window_policy(policy: str) -> str:
    """The window's own policy for a conversation's: "compact" makes a new branch before the
    send (compact.py) and, should that still not fit, drops the oldest turns."""
    return "drop_oldest" if policy == "compact" else policy


def _dropped_to_fit(window: ContextWindow, messages: list[dict], reserve: int) -> int | None:
    """How many of the oldest messages policy "drop_oldest" would leave out; None when even
    that cannot make the request fit (the message alone is too long)."""
    try:
        return window.fit(messages, reserve, "drop_oldest").num_dropped
    except ContextOverflowError:
        return None


def sent_messages(messages: list[dict], dropped: int) -> list[dict]:
    """The messages a request sent when it left out `dropped` messages after the system
    prompt (the inverse of fit_prompt's choice, for Continue)."""
    head, turns = split_turns(messages)
    return head + [m for turn in turns for m in turn][dropped:]


def continue_prompt(backend, messages: list[dict], dropped: int, reply_ids: list[int],
                    params: SamplingParams, policy: str = "drop_oldest") -> tuple[ContinueRequest, int]:
    """The request that extends a reply from its stored token ids, and how many messages its
    prompt leaves out. The prompt is the one the reply answered (re-rendered with the same
    `dropped` messages left out, so its ids and cached blocks are the same), then the reply's
    tokens; up to params.max_tokens more tokens. When that leaves no room for the reply to
    grow (a reply that filled the context), policy "drop_oldest" leaves out more whole turns
    (the reply's own turn always stays); "error" says so instead."""
    window = window_of(backend)
    if window is None or not hasattr(backend, "submit_ids"):
        raise ContextError("Continue needs the local engine (this backend does not give "
                           "token ids)")
    if not reply_ids:
        raise ContextError("This reply has no stored tokens to continue from: regenerate it.")
    more = params.max_tokens
    params = dataclasses.replace(params, max_tokens=None if more is None else more + len(reply_ids))
    room = reply_reserve(more, window.limit)
    prompt_ids, k = window.token_ids(sent_messages(messages, dropped)), dropped
    if len(prompt_ids) + len(reply_ids) + room > window.limit and \
            window_policy(policy) == "drop_oldest":
        _, turns = split_turns(messages)
        bounds = [sum(len(t) for t in turns[:n]) for n in range(1, len(turns))]
        for n in (b for b in bounds if b > dropped):          # fewest more turns left out
            ids = window.token_ids(sent_messages(messages, n))
            if len(ids) + len(reply_ids) < window.limit:     # room for one token, at least
                prompt_ids, k = ids, n
            if len(ids) + len(reply_ids) + room <= window.limit:
                break
    try:
        return continue_request(prompt_ids, reply_ids, params, window.limit), k
    except ValueError as exc:
        raise ContextError(f"This reply cannot be continued: {exc}.") from exc


def chat_prompt(system_prompt: str, path: list[Message],
                images: ImageSource | None = None) -> list[dict]:
    """The engine's chat messages for a path: the system prompt (if any), then the path (with
    attachments, tool calls and tool results: tools/messages.py; images with their pixels from
    `images`, the store, where a prompt is counted or sent). The system-role messages a
    path starts with (a compacted branch's summary) join the system prompt in one system
    message, which every chat template accepts."""
    lead = leading_system(path)
    parts = [system_prompt] if system_prompt else []
    parts += [(SUMMARY_INTRO if "summary_of" in m.extra else "") + m.content for m in path[:lead]]
    msgs = [{"role": "system", "content": "\n\n".join(parts)}] if parts else []
    return msgs + [message_dict(m, images) for m in path[lead:]]


def leading_system(path: list[Message]) -> int:
    """How many system-role messages the path starts with."""
    n = 0
    while n < len(path) and path[n].role == "system":
        n += 1
    return n


def prompt_messages(store: Store, cid: int, last_id: int | None) -> list[dict]:
    """The engine's chat messages: the system prompt, then the path down to last_id."""
    path = store.path_to(last_id) if last_id is not None else []
    return chat_prompt(store.get_conversation(cid).system_prompt, path, store)


class ContextFeatures:
    """The context features of a conversation: its policy, the gauge's numbers, Continue."""

    def __init__(self, turns: TurnRegistry, store: Store,
                 backend: Callable[[], ChatBackend | None], settings: ConversationSettings) -> None:
        self.turns, self.store, self.backend, self.settings = turns, store, backend, settings

    def set_policy(self, cid: int, policy: str) -> Conversation:
        """What a send does when the conversation no longer fits: "drop_oldest" | "error" |
        "compact" (ValueError naming the choices otherwise)."""
        conv = self.store.get_conversation(cid)
        if conv.context_policy == policy:
            return conv
        return self.store.update_conversation(cid, context_policy=policy)

    def usage(self, cid: int, draft: str = "", system_prompt: str | None = None,
              max_tokens: int | None = None) -> ContextUsage | None:
        """The gauge: tokens the next request will use (the system prompt, the shown path and
        the draft) against the context limit; None when the backend cannot count (remote,
        no model yet). `system_prompt`, `max_tokens`: the fields as shown (default: saved)."""
        backend = with_thinking(self.backend(), self.settings.thinking(cid))
        if backend is None:
            return None
        conv = self.store.get_conversation(cid)
        system = conv.system_prompt if system_prompt is None else system_prompt
        msgs = chat_prompt(system, self.store.active_path(cid), self.store)
        max_tokens = max_tokens or self.settings.read(cid)[1]["max_tokens"]
        try:
            return usage(backend, msgs, draft, max_tokens, conv.context_policy)
        except ValueError:          # images a text-only model cannot count: a send says why
            return None

    def continue_reply(self, message_id: int, sampling: Sampling | None = None) -> Turn:
        """Extend a reply that stopped before its natural end, in place: the engine resumes
        from the reply's stored tokens (its prompt's blocks are found in the prefix cache) and
        writes up to max_tokens (`sampling`, default: the conversation's) more into the same
        message. A reply that filled the context goes on with older turns left out (policy
        drop_oldest; the reply's `context_dropped` follows)."""
        m = self.store.get_message(message_id)
        if m.role != "assistant":
            raise ChatError("only a reply can be continued: select one")
        if m.status == "complete" and m.stats.get("finish_detail") in NATURAL_ENDS:
            raise ChatError("this reply ended naturally: there is nothing to continue")
        if self.store.children(m.id):
            raise ChatError("this reply has messages after it: fork here, then continue it")
        cid = m.conversation_id
        params = (sampling or self.settings.sampling(cid)).params

        def start(backend: ChatBackend) -> Turn:
            msgs = prompt_messages(self.store, cid, m.parent_id)
            req, dropped = continue_prompt(
                backend, msgs, int(m.stats.get("context_dropped", 0)), m.token_ids or [],
                params, self.store.get_conversation(cid).context_policy)
            request_id = f"conv{cid}-{uuid.uuid4().hex[:8]}"
            image_prompt = getattr(backend, "image_prompt", None)
            images = image_prompt(sent_messages(msgs, dropped)) if image_prompt else None
            stream = backend.submit_ids(req.prompt_token_ids, req.params, request_id,
                                        **({"images": images} if images else {}))
            m.stats["context_dropped"] = dropped
            try:
                self.store.update_message(m.id, status="streaming",
                                          stats={"context_dropped": dropped})
                self.store.set_active(m.id)
            except BaseException:
                backend.abort(request_id)
                raise
            reply = LiveReply(m.id, m.content, stats=dict(m.stats), token_ids=m.token_ids,
                              prefix_ids=list(m.token_ids),
                              reasoning=str(m.extra.get("reasoning") or ""),
                              prefix_choices=self.store.alternatives(m.id))
            return Turn(cid, request_id, [reply], stream, backend.abort, self.store,
                        decode=backend.decode, reasoning=reasoning_of(backend))
        return self.turns.launch(cid, with_thinking(self.backend(), self.settings.thinking(cid)),
                                 start)
