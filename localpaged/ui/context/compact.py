"""Compaction that keeps the original, in plain Python: a conversation grown past the model's
context goes on in a new branch that starts from the system prompt, a summary of its oldest
turns written by the model, and copies of the recent turns that fit; the original path stays in
the tree as it was (nothing is rewritten or deleted), a sibling of the new branch's first
message (`‹ 1/2 ›`).

The summary is one request through the conversation's backend: the system prompt and the turns
to summarise (the prefix the original path already cached), then a user message asking for the
summary (`COMPACT_PROMPT`, or the conversation's own, `conversations.options["compact_prompt"]`).
It runs as a turn (`CompactTurn`, in the registry like a chat reply: the conversation is busy
meanwhile, Stop cancels it): the summary is a system-role root marked `extra.summary_of` (the
ids it summarises), made active with status 'streaming' when the request starts, so the tab
shows the new branch's summary as it is written. Stopped or failed, the summary is deleted and
the path shown before is active again: nothing half-made is kept and no row of the original
changes. Written, it is saved and the copies follow; `logic.chat_prompt` joins the summary to
the system prompt, so every request of the new branch sends system prompt + summary, the copied
turns, then what follows. A compaction started by a send, regenerate or edit (chat/logic.py)
hands on to the turn that answers on the new branch (`Turn.then`), so one handler follows both.

Which turns are kept: the most recent whole turns that fit with the summary's room
(`reply_reserve` of the conversation's max_tokens, which also caps the summary) and the reply's
room, and the message about to be sent (the draft); at least the oldest turn is summarised. A
copy (`extra.copy_of`: the original's id) keeps the text, token ids, token alternatives
(`store/alternatives.py`), status and sampling; of the stats only those that describe its text
(`COPIED_STATS`): a copy was not generated, so it claims no tokens/s, TTFT or prefill.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from localpaged.chat.backend import ChatBackend, reasoning_of
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.outputs import RequestOutput

from ..settings.logic import ConversationSettings, Sampling
from ..store import Message, Store
from ..store.retry import until_saved
from ..turn_registry import TurnRegistry
from ..live_reply import LiveReply
from ..turns import ChatError, Turn
from .logic import chat_prompt, fit_prompt, leading_system, reply_reserve, window_of

log = logging.getLogger(__name__)

COMPACT_PROMPT = ("Summarise the conversation so far for your own later reference: the facts, "
                  "names, decisions, open questions and anything the user asked you to keep in "
                  "mind. Write only the summary, in a few short paragraphs.")
OPTION = "compact_prompt"            # the conversation's own prompt, in conversations.options
PROMPT_MAX_CHARS = 4000
NO_SUMMARY = "(the model wrote no summary)"
# The stats a copy keeps: they describe its text (how it ended, its reasoning, its model), not
# a generation of the copy.
COPIED_STATS = ("finish_reason", "finish_detail", "reasoning_tokens", "model")
# A turn's reply to a new branch's leaf: (backend, the leaf's id) -> a Turn, not started.
FollowUp = Callable[[ChatBackend, int], Turn]


def path_turns(path: list[Message]) -> tuple[list[Message], list[list[Message]]]:
    """(the leading system-role messages: an earlier summary, the turns): a turn starts at
    each user message, as `chat.context_window.split_turns` splits chat messages."""
    lead = leading_system(path)
    turns: list[list[Message]] = []
    for m in path[lead:]:
        if not turns or m.role == "user":
            turns.append([])
        turns[-1].append(m)
    return path[:lead], turns


class Compaction:
    """Compact a conversation into a new branch; the compaction prompt setting."""

    def __init__(self, turns: TurnRegistry, store: Store,
                 backend: Callable[[], ChatBackend | None], settings: ConversationSettings) -> None:
        self.turns, self.store, self.backend, self.settings = turns, store, backend, settings

    # ---- the prompt the summary is asked with ----------------------------------------------
    def prompt(self, cid: int) -> str:
        text = self.store.get_conversation(cid).options.get(OPTION)
        return text if isinstance(text, str) and text.strip() else COMPACT_PROMPT

    def set_prompt(self, cid: int, text: str) -> str:
        """Save conversation cid's compaction prompt (blank: the default); returns it."""
        text = (text or "").strip()
        if len(text) > PROMPT_MAX_CHARS:
            raise ValueError(f"the compaction prompt is longer than {PROMPT_MAX_CHARS} "
                             "characters")
        conv = self.store.get_conversation(cid)
        options = {k: v for k, v in conv.options.items() if k != OPTION}
        if text and text != COMPACT_PROMPT:
            options[OPTION] = text
        if options != conv.options:
            self.store.update_conversation(cid, options=options)
        return self.prompt(cid)

    # ---- compaction ------------------------------------------------------------------------
    def needed(self, cid: int, last_id: int | None, draft: dict,
               sampling: Sampling | None = None) -> bool:
        """Whether sending `draft` (a chat message) after the path down to last_id would not
        fit the context, with a turn there to summarise."""
        window = self._window()
        if window is None or last_id is None:
            return False
        path = self.store.path_to(last_id)
        if not path_turns(path)[1]:
            return False
        msgs = chat_prompt(self.store.get_conversation(cid).system_prompt, path,
                           self.store) + [draft]
        reserve = reply_reserve(self._params(cid, sampling).max_tokens, window.limit)
        return window.count_tokens(msgs) + reserve > window.limit

    def start(self, cid: int, last_id: int | None = None, draft: dict | None = None,
              sampling: Sampling | None = None, then: FollowUp | None = None) -> Turn:
        """The turn that summarises the oldest turns of the path down to last_id (default: the
        shown path) and makes the new branch (active); `draft`: a message about to be sent on
        it (it needs room too), which `then` sends once the branch is made: the turn it
        returns is the compaction's `then`, the conversation's turn from there on."""
        if self._window() is None:
            raise ChatError("Compact needs the local engine (it counts the context's tokens)")

        def begin(backend: ChatBackend) -> Turn:
            leaf = last_id
            if leaf is None:
                shown = self.store.active_path(cid)
                leaf = shown[-1].id if shown else None
            plan = self._plan(backend, cid, leaf, draft, sampling)
            request_id = f"compact{cid}-{uuid.uuid4().hex[:8]}"
            stream = backend.chat(plan.request, [plan.params], request_id=request_id)
            try:
                root = self.store.add_message(cid, None, "system", "", status="streaming",
                                              extra={"summary_of": plan.summary_of})
            except BaseException:
                backend.abort(request_id)
                raise
            hand_on = None if then is None else lambda new_leaf: self._hand_on(
                cid, backend, then, new_leaf)
            return CompactTurn(cid, request_id, LiveReply(root.id), stream, backend,
                               self.store, plan, self._branch, hand_on)
        return self.turns.launch(cid, self.backend(), begin)

    def _window(self):
        backend = self.backend()
        return window_of(backend) if backend is not None else None

    def _params(self, cid: int, sampling: Sampling | None) -> SamplingParams:
        return (sampling or self.settings.sampling(cid)).params

    def _plan(self, backend: ChatBackend, cid: int, leaf: int | None, draft: dict | None,
              sampling: Sampling | None) -> "CompactPlan":
        """Which turns the summary holds and which are copied, and the summary's request."""
        window = window_of(backend)
        if window is None:
            raise ChatError("Compact needs the local engine (it counts the context's tokens)")
        conv = self.store.get_conversation(cid)
        head, turns = path_turns(self.store.path_to(leaf) if leaf is not None else [])
        if len(turns) < (1 if draft else 2):
            raise ChatError("nothing to compact yet: the conversation has one turn")
        params = self._params(cid, sampling)
        room = reply_reserve(params.max_tokens, window.limit)     # the reply's and the summary's
        placeholder = Message(0, cid, None, "system", "", 0.0, None, None, "complete", {},
                              extra={"summary_of": []})
        after = [draft] if draft else []
        kept = 0
        for k in range(len(turns) - 1, 0, -1):
            recent = [m for t in turns[-k:] for m in t]
            msgs = chat_prompt(conv.system_prompt, [placeholder] + recent, self.store) + after
            if window.count_tokens(msgs) + 2 * room <= window.limit:
                kept = k
                break
        old = head + [m for t in turns[:len(turns) - kept] for m in t]
        request = chat_prompt(conv.system_prompt, old, self.store) + [
            {"role": "user", "content": self.prompt(cid)}]
        params = dataclasses.replace(params, max_tokens=room)
        sent = fit_prompt(backend, request, room, "drop_oldest")
        return CompactPlan(sent.messages, params, [m.id for m in old],
                           [m for t in turns[len(turns) - kept:] for m in t], leaf)

    def _hand_on(self, cid: int, backend: ChatBackend, then: FollowUp, leaf: int) -> Turn:
        """The reply on the new branch becomes the conversation's turn (it stays busy)."""
        turn = then(backend, leaf)
        self.turns.adopt(cid, turn)
        return turn.start()

    def _branch(self, summary_id: int, recent: list[Message]) -> int:
        """Copies of `recent` below the summary, each the active child of the one before;
        returns the new branch's leaf (active)."""
        parent = summary_id
        for m in recent:
            stats = {k: m.stats[k] for k in COPIED_STATS if k in m.stats}
            copy = self.store.add_message(m.conversation_id, parent, m.role, m.content,
                                          m.sampling, m.status, stats,
                                          extra={**m.extra, "copy_of": m.id})
            if m.token_ids:
                self.store.update_message(copy.id, token_ids=m.token_ids)
            if choices := self.store.alternatives(m.id):
                self.store.set_alternatives(copy.id, choices)
            parent = copy.id
        self.store.set_active(parent)
        return parent


@dataclass
class CompactPlan:
    """One compaction, decided before the summary is asked for."""
    request: list[dict]          # the summary request's chat messages
    params: SamplingParams       # its params (max_tokens: the summary's room)
    summary_of: list[int]        # the messages the summary holds (the oldest of the path)
    recent: list[Message]        # the turns copied onto the new branch
    shown: int | None            # the leaf of the path compacted (active again if stopped)


class CompactTurn(Turn):
    """A compaction's summary request: `replies[0]` is the summary as it streams (its row a new
    root, 'streaming', active). Written, it is saved, the copies follow (`branch`) and
    `hand_on` (if any) starts the reply on the new branch, which becomes `then`; `branched` is
    the new branch's leaf. Stopped or failed, the summary row is deleted and the path shown
    before is active again (`branched` stays None)."""

    def __init__(self, conversation_id: int, request_id: str, summary: LiveReply,
                 stream: Iterator[RequestOutput], backend: ChatBackend, store: Store,
                 plan: CompactPlan, branch: Callable[[int, list[Message]], int],
                 hand_on: Callable[[int], Turn] | None = None) -> None:
        super().__init__(conversation_id, request_id, [summary], stream, backend.abort, store,
                         reasoning=reasoning_of(backend))
        self.plan, self._branch, self._hand_on = plan, branch, hand_on
        self.branched: int | None = None

    def stop(self) -> None:
        super().stop()
        if self.then is not None:
            self.then.stop()

    def _run(self) -> None:
        out = self._consume()
        summary = self.replies[0]
        try:
            if self._stop.is_set() or self.error is not None:
                self._undo(summary)
            else:
                summary.text = summary.text.strip() or NO_SUMMARY
                self._save_replies(out, [summary])
                if self.error is None:
                    self.branched = self._branch(summary.message_id, self.plan.recent)
                    if self._hand_on is not None and not self._stop.is_set():
                        self.then = self._hand_on(self.branched)
                        if self._stop.is_set():         # a Stop that came meanwhile
                            self.then.stop()
        except Exception as exc:  # noqa: BLE001 - shown to the user; what is stored stays
            log.exception("compaction %s", self.request_id)
            self.error = self.error or str(exc) or type(exc).__name__
        self._end()

    def _undo(self, summary: LiveReply) -> None:
        """Nothing half-made is kept: the summary row goes, the path shown before is back."""
        def write() -> None:
            self._store.delete_message(summary.message_id)
            if self.plan.shown is not None:
                self._store.set_active(self.plan.shown)
        until_saved(self._store, write, f"the stopped summary {summary.message_id}")
        summary.status = "deleted"
