"""Compaction that keeps the original, in plain Python: a conversation grown past the model's
context goes on in a new branch that starts from the system prompt, a summary of its oldest
turns written by the model, and copies of the recent turns that fit; the original path stays in
the tree as it was (nothing is rewritten or deleted), a sibling of the new branch's first
message (`‹ 1/2 ›`).

The summary is one request through the conversation's backend: the system prompt and the turns
to summarise (the prefix the original path already cached), then a user message asking for the
summary (`COMPACT_PROMPT`, or the conversation's own, `conversations.options["compact_prompt"]`).
It is stored as a system-role root message marked `extra.summary_of` (the ids it summarises);
`logic.chat_prompt` joins it to the system prompt, so every request of the new branch sends
system prompt + summary, the copied turns (each marked `extra.copy_of`), then what follows.

Which turns are kept: the most recent whole turns that fit with the summary's room
(`reply_reserve` of the conversation's max_tokens, which also caps the summary) and the reply's
room, and the draft being sent; at least the oldest turn is summarised. Run by the Compact
button (`compact`) and by a send under policy "compact" that would not fit (`needed`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

from localpaged.chat.backend import ChatBackend, reasoning_of

from ..settings.logic import ConversationSettings, Sampling
from ..store import Message, Store
from ..turns import ChatError, TurnRegistry
from .logic import (chat_prompt, fit_prompt, leading_system, prompt_messages, reply_reserve,
                    window_of)

COMPACT_PROMPT = ("Summarise the conversation so far for your own later reference: the facts, "
                  "names, decisions, open questions and anything the user asked you to keep in "
                  "mind. Write only the summary, in a few short paragraphs.")
OPTION = "compact_prompt"            # the conversation's own prompt, in conversations.options
PROMPT_MAX_CHARS = 4000


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
    def needed(self, cid: int, draft: str, sampling: Sampling | None = None) -> bool:
        """Whether sending `draft` on the shown path would not fit the context."""
        backend = self.backend()
        window = window_of(backend) if backend is not None else None
        if window is None:
            return False
        path = self.store.active_path(cid)
        msgs = prompt_messages(self.store, cid, path[-1].id if path else None)
        reserve = reply_reserve(self._params(cid, sampling).max_tokens, window.limit)
        return window.count_tokens(msgs, draft or None) + reserve > window.limit

    def compact(self, cid: int, draft: str = "", sampling: Sampling | None = None) -> list[Message]:
        """Summarise the oldest turns of the shown path and make the new branch (active);
        returns its path. `draft`: a message about to be sent on it (it needs room too)."""
        backend = self.backend()
        window = window_of(backend) if backend is not None else None
        if window is None:
            raise ChatError("Compact needs the local engine (it counts the context's tokens)")
        self.turns.check_idle(cid)
        conv = self.store.get_conversation(cid)
        head, turns = path_turns(self.store.active_path(cid))
        if len(turns) < 2:
            raise ChatError("nothing to compact yet: the conversation has one turn")
        params = self._params(cid, sampling)
        room = reply_reserve(params.max_tokens, window.limit)     # the reply's and the summary's
        placeholder = Message(0, cid, None, "system", "", 0.0, None, None, "complete", {},
                              extra={"summary_of": []})
        kept = 0
        for k in range(len(turns) - 1, 0, -1):
            recent = [m for t in turns[-k:] for m in t]
            msgs = chat_prompt(conv.system_prompt, [placeholder] + recent)
            if window.count_tokens(msgs, draft or None) + 2 * room <= window.limit:
                kept = k
                break
        old = head + [m for t in turns[:len(turns) - kept] for m in t]
        request = chat_prompt(conv.system_prompt, old) + [{"role": "user",
                                                          "content": self.prompt(cid)}]
        summary = self._summarise(backend, request, dataclasses.replace(params, max_tokens=room))
        return self._branch(cid, summary, [m.id for m in old],
                            [m for t in turns[len(turns) - kept:] for m in t])

    def _params(self, cid: int, sampling: Sampling | None):
        return (sampling or self.settings.sampling(cid)).params

    @staticmethod
    def _summarise(backend: ChatBackend, messages: list[dict], params) -> str:
        """The model's summary (its answer: reasoning left out), one request, waited for."""
        sent = fit_prompt(backend, messages, params.max_tokens, "drop_oldest")
        stream = backend.chat(sent.messages, [params], request_id=f"compact-{uuid.uuid4().hex[:8]}")
        out = None
        try:
            for out in stream:
                pass
        finally:
            close = getattr(stream, "close", None)
            if close:
                close()
        comp = out.outputs[0] if out is not None and out.outputs else None
        text = comp.text if comp is not None else ""
        fmt = reasoning_of(backend)
        if fmt is not None and text:
            text = fmt.split(text, out.prompt_token_ids or []).content
        return text.strip() or "(the model wrote no summary)"

    def _branch(self, cid: int, summary: str, summary_of: list[int],
                recent: list[Message]) -> list[Message]:
        """The new branch: a root holding the summary, then copies of `recent` (text, settings,
        stats, tokens), each the active child of the one before."""
        parent = self.store.add_message(cid, None, "system", summary,
                                        extra={"summary_of": summary_of}).id
        for m in recent:
            stats = {k: v for k, v in m.stats.items() if k != "context_dropped"}
            copy = self.store.add_message(cid, parent, m.role, m.content, m.sampling, m.status,
                                          stats, extra={**m.extra, "copy_of": m.id})
            if m.token_ids:
                self.store.update_message(copy.id, token_ids=m.token_ids)
            parent = copy.id
        return self.store.set_active(parent)
