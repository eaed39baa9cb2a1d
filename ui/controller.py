"""ChatController: the plain-Python functions behind every event of the chat UI.

It owns the link between the conversation store (`store.py`) and the engine (a ChatBackend, got
from a provider so the model can be swapped): conversations (new, rename, delete, search,
settings, export), the message tree (switch siblings, pick a compare column, fork), and
generation (send, regenerate, edit, compare, continue, stop), which runs as `generation.Turn`s,
at most one per conversation and any number at once across conversations. Every request is
fitted to the model's context first (`context.py`, the conversation's policy): a message that
cannot be sent is not stored, and a reply records how many older messages it left out. It returns store rows and
Turns, never Gradio objects, so it is tested without a browser; every UI handler reads and
writes through it (the feature modules listed in `app.py` render what it returns).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localpaged.chat.backend import ChatBackend, is_local

from . import context
from .controller_context import ChatError, ContextFeatures, chat_prompt
from .generation import LiveReply, Turn
from .open_tabs import OpenTabsFile
from .prepared import PreparedReplies
from .sampling import clean_sampling, sampling_record, to_params
from .store import Conversation, Message, Store

log = logging.getLogger(__name__)

NEW_TITLE = "New chat"
MAX_COLUMNS = 4


@dataclass
class View:
    """What a chat tab shows: the active path, each message's (position, count) among its
    siblings, and the live replies of a running turn (by message id)."""
    conversation: Conversation
    path: list[Message]
    siblings: list[tuple[int, int]]
    live: dict[int, LiveReply]
    busy: bool


@dataclass
class Branch:
    """One root-to-leaf path of a conversation's tree; `active` when it is the path shown."""
    leaf_id: int
    path: list[Message]
    active: bool


class ChatController(ContextFeatures):
    def __init__(self, store: Store, backend: Callable[[], ChatBackend | None],
                 default_sampling: dict[str, Any] | None = None,
                 state_file: str | Path | None = None) -> None:
        self.store = store
        self._backend = backend
        self.default_sampling = clean_sampling(default_sampling)
        self._open_tabs = OpenTabsFile(state_file)
        self._turns: dict[int, Turn] = {}          # conversation id -> its latest turn
        self._starting: set[int] = set()           # conversations whose turn is being set up
        self._lock = threading.Lock()
        self._settings_lock = threading.Lock()     # one read-merge-write of settings at a time
        self.prepared = PreparedReplies(self)      # alternatives made in the background

    def backend(self) -> ChatBackend | None:
        return self._backend()

    # ---- conversations --------------------------------------------------------------------
    def new_conversation(self, title: str = NEW_TITLE) -> Conversation:
        return self.store.create_conversation(title.strip() or NEW_TITLE,
                                              sampling=dict(self.default_sampling))

    def rename(self, cid: int, title: str) -> Conversation:
        if not title.strip():
            raise ChatError("a title cannot be empty")
        return self.store.rename_conversation(cid, title.strip()[:200])

    def delete(self, cid: int) -> bool:
        self.stop(cid)
        self.prepared.cancel(cid, moving_on=False)
        return self.store.delete_conversation(cid)

    def search(self, query: str = "") -> list[Conversation]:
        return self.store.list_conversations(query.strip() or None)

    def conversation(self, cid: int) -> Conversation:
        return self.store.get_conversation(cid)

    def settings(self, cid: int) -> tuple[str, dict[str, Any]]:
        conv = self.store.get_conversation(cid)
        return conv.system_prompt, clean_sampling(conv.sampling, self.default_sampling)

    def update_settings(self, cid: int, system_prompt: str, sampling: dict[str, Any]) -> Conversation:
        """Raises ValueError naming a bad field; nothing is saved then."""
        old_prompt, old = self.settings(cid)
        new = clean_sampling(sampling, self.default_sampling)
        if system_prompt == old_prompt and new == old:
            return self.store.get_conversation(cid)      # unchanged: keep the sidebar order
        return self.store.update_conversation(cid, system_prompt=system_prompt, sampling=new)

    def update_setting(self, cid: int, key: str, value: Any) -> Conversation:
        """One field edited ("system_prompt" or a sampling key): merged into what is stored, so
        quick edits of two fields, handled at once by two threads, cannot undo each other."""
        with self._settings_lock:
            system_prompt, sampling = self.settings(cid)
            if key == "system_prompt":
                return self.update_settings(cid, value or "", sampling)
            return self.update_settings(cid, system_prompt, {**sampling, key: value})

    def export(self, cid: int, fmt: str = "markdown") -> str:
        if fmt == "json":
            return json.dumps(self.store.export_json(cid), indent=2, ensure_ascii=False)
        return self.store.export_markdown(cid)

    # ---- the tree ---------------------------------------------------------------------------
    def view(self, cid: int) -> View:
        path = self.store.active_path(cid)
        sib = []
        for m in path:
            ids, index = self.prepared.visible_siblings(m.id)
            sib.append((index + 1, len(ids)))
        turn = self.turn(cid)
        live = {r.message_id: r for r in turn.replies} if turn and not turn.done else {}
        return View(self.store.get_conversation(cid), path, sib, live, bool(live))

    def message(self, message_id: int) -> Message:
        return self.store.get_message(message_id)

    def message_at(self, cid: int, index: int | None) -> Message:
        """The message at `index` on the shown path (the last one for None or past the end)."""
        path = self.store.active_path(cid)
        if not path:
            raise ChatError("there is no message yet")
        return path[-1 if index is None or index >= len(path) else index]

    def branches(self, cid: int) -> tuple[Conversation, list[Branch]]:
        """Every root-to-leaf path: the shown one first, then newest leaf first."""
        msgs = {m.id: m for m in self.store.messages(cid)}
        parents = {m.parent_id for m in msgs.values()}
        shown = self.store.active_path(cid)
        shown_leaf = shown[-1].id if shown else None
        leaves = sorted((i for i in msgs if i not in parents), key=lambda i: (i != shown_leaf, -i))
        out = []
        for leaf in leaves:
            path, cur = [], msgs.get(leaf)
            while cur is not None:
                path.append(cur)
                cur = msgs.get(cur.parent_id)
            out.append(Branch(leaf, path[::-1], leaf == shown_leaf))
        return self.store.get_conversation(cid), out

    def switch(self, message_id: int, step: int) -> list[Message]:
        """Show the sibling `step` places after (or before) this message, wrapping round (a
        prepared reply among them is now seen)."""
        ids, index = self.prepared.visible_siblings(message_id)
        self.prepared.opened(ids[(index + step) % len(ids)])
        return self.store.active_path(self.store.get_message(message_id).conversation_id)

    def pick(self, message_id: int) -> list[Message]:
        """Continue with this reply (a compare column): it becomes the active branch."""
        return self.store.set_active(message_id)

    def fork(self, message_id: int) -> Conversation:
        """A new conversation holding the path down to this message; its title starts with
        ⎇ (visible even in a shortened tab label)."""
        src = self.store.get_conversation(self.store.get_message(message_id).conversation_id)
        return self.store.fork_conversation(message_id, title=f"⎇ {src.title}")

    # ---- generation -------------------------------------------------------------------------
    def turn(self, cid: int) -> Turn | None:
        with self._lock:
            return self._turns.get(cid)

    def busy(self, cid: int) -> bool:
        with self._lock:
            turn = self._turns.get(cid)
            return cid in self._starting or (turn is not None and not turn.done)

    def send(self, cid: int, text: str) -> Turn:
        """Add the user's message at the end of the shown path and answer it. With empty text,
        answer the last message if it is the user's (a reply that failed before)."""
        path = self.store.active_path(cid)
        if not text.strip():
            if path and path[-1].role == "user":
                return self._generate(cid, path[-1].id, 1)
            raise ChatError("type a message first")
        params = self._params(cid, 1)                          # bad settings: nothing written
        self._check_idle(cid)
        return self._generate(cid, path[-1].id if path else None, 1, params, user_text=text)

    def regenerate(self, message_id: int) -> Turn:
        """A new reply beside this one (the old one stays as a sibling); for a user message,
        a new reply to it. A reply prepared in the background is shown instead, at once, when
        there is one (no new request)."""
        m = self.store.get_message(message_id)
        parent = m.id if m.role == "user" else m.parent_id
        if parent is None:
            raise ChatError("this reply has no user message to answer")
        self._check_idle(m.conversation_id)
        ready = self.prepared.reveal(parent)
        if ready is None:
            return self._generate(m.conversation_id, parent, 1)
        if not ready.done:                     # still streaming: the tab follows it
            with self._lock:
                self._turns[m.conversation_id] = ready
        return ready

    def edit(self, message_id: int, text: str) -> Turn:
        """A new version of an earlier user message, answered: a new branch beside the old."""
        m = self.store.get_message(message_id)
        if m.role != "user":
            raise ChatError("only your own messages can be edited")
        if not text.strip():
            raise ChatError("the edited message is empty")
        params = self._params(m.conversation_id, 1)
        self._check_idle(m.conversation_id)
        return self._generate(m.conversation_id, m.parent_id, 1, params, user_text=text)

    def compare(self, cid: int, text: str, columns: list[dict[str, Any]] | int) -> Turn:
        """One prompt, several replies decoded in one batch: `columns` is a number of samples
        of the conversation's settings (seed + i when a seed is set) or one settings dict per
        column. The replies are siblings; the first is shown until another is picked."""
        k = columns if isinstance(columns, int) else len(columns)
        if not 2 <= k <= MAX_COLUMNS:
            raise ChatError(f"compare takes 2 to {MAX_COLUMNS} columns, not {k}")
        if isinstance(columns, int):
            params = self._params(cid, k)
        else:
            _, base = self.settings(cid)
            params = [to_params(clean_sampling(c, base)) for c in columns]
        return self._compare(cid, text, k, params)

    def compare_beams(self, cid: int, text: str, width: int) -> Turn:
        """Compare's beam-search mode: the `width` final beams of one beam search over the
        prompt, as columns (siblings, the best shown first), each with its score. Needs the
        local engine."""
        if not is_local(self.backend()):
            raise ChatError("beam search needs the local engine: the remote backend "
                            "(--backend) has none; compare samples or settings instead")
        if not 2 <= width <= MAX_COLUMNS:
            raise ChatError(f"compare takes 2 to {MAX_COLUMNS} beams, not {width}")
        return self._compare(cid, text, width, self._params(cid, width), beam=width)

    def _compare(self, cid: int, text: str, k: int, params: list, beam: int = 0) -> Turn:
        """A compare prompt: a user message at the end of the shown path, answered k times."""
        if not text.strip():
            raise ChatError("type a prompt to compare")
        self._check_idle(cid)
        path = self.store.active_path(cid)
        return self._generate(cid, path[-1].id if path else None, k, params, user_text=text,
                              beam=beam)

    def edit_cost(self, message_id: int, text: str) -> tuple[int, int] | None:
        """Before saving an edit: (prompt tokens the new branch reuses from the prefix cache,
        tokens it must prefill), as the engine would admit it now; None over a remote backend."""
        m = self.store.get_message(message_id)
        backend = self.backend()
        if m.role != "user" or not is_local(backend):
            return None
        path = self.store.path_to(m.parent_id) if m.parent_id is not None else []
        edited = chat_prompt(self.store.get_conversation(m.conversation_id).system_prompt, path)
        reused, total = backend.cached_prefix_tokens(edited + [{"role": "user", "content": text}])
        return reused, total - reused

    def stop(self, cid: int) -> bool:
        turn = self.turn(cid)
        if turn is None or turn.done:
            return False
        turn.stop()
        return True

    def stop_all(self, wait: float = 0.0) -> None:
        """Stop every running turn; with `wait`, give them that long to save their text."""
        with self._lock:
            turns = [t for t in self._turns.values() if not t.done]
        for turn in turns:
            turn.stop()
        for turn in turns:
            turn.wait(wait)
        self.prepared.cancel_all(wait)

    def _params(self, cid: int, k: int) -> list:
        _, sampling = self.settings(cid)
        return [to_params(sampling, seed_offset=i) for i in range(k)]

    def _check_idle(self, cid: int) -> None:
        if self.busy(cid):
            raise ChatError("this conversation is still generating: stop it or wait")

    def _generate(self, cid: int, parent_id: int | None, k: int, params: list | None = None,
                  user_text: str | None = None, beam: int = 0) -> Turn:
        """k replies to `parent_id` (a beam search of width `beam` if set); with `user_text`, to
        a new user message under it, stored only once the request is known to fit the context
        (else ContextError, nothing stored). The conversation's background alternatives are
        cancelled first (see prepared.py)."""
        params = params or self._params(cid, k)
        if user_text is not None and self.backend() is None:
            self._add_user(cid, parent_id, user_text)      # kept: a later empty send answers it
        return self._launch(cid, lambda b: self._start(b, cid, parent_id, params, user_text, beam))

    def _add_user(self, cid: int, parent_id: int | None, text: str) -> Message:
        if self.store.get_conversation(cid).title == NEW_TITLE:
            self.store.rename_conversation(cid, _title_from(text))
        return self.store.add_message(cid, parent_id, "user", text)

    def _launch(self, cid: int, start: Callable[[ChatBackend], Turn]) -> Turn:
        backend = self.backend()
        if backend is None:
            raise ChatError("no model is loaded yet: wait for the model to finish loading")
        with self._lock:
            turn = self._turns.get(cid)
            if cid in self._starting or (turn is not None and not turn.done):
                raise ChatError("this conversation is still generating: stop it or wait")
            self._starting.add(cid)
        try:
            self.prepared.cancel(cid)
            turn = start(backend)
            with self._lock:
                self._turns[cid] = turn
        finally:
            with self._lock:
                self._starting.discard(cid)
        return turn.start()

    def _start(self, backend: ChatBackend, cid: int, parent_id: int | None, params: list,
               user_text: str | None, beam: int = 0) -> Turn:
        conv = self.store.get_conversation(cid)
        prompt = self.prompt_messages(cid, parent_id)
        if user_text is not None:
            prompt.append({"role": "user", "content": user_text})
        sent = context.fit_prompt(backend, prompt, params[0].max_tokens, conv.context_policy)
        request_id = f"conv{cid}-{uuid.uuid4().hex[:8]}"
        if beam:                                        # ValueError: bad input
            stream = backend.beam_search(sent.messages, beam, params[0].max_tokens, request_id)
        else:
            stream = backend.chat(sent.messages, params, request_id=request_id)
        user = None
        try:
            if user_text is not None:
                user = self._add_user(cid, parent_id, user_text)
                parent_id = user.id
            stats = {"context_dropped": sent.dropped} if sent.dropped else {}
            replies = [LiveReply(self.store.add_message(
                cid, parent_id, "assistant", "", sampling_record(p), status="streaming",
                stats=stats).id) for p in params]
            self.store.set_active(replies[0].message_id)
        except BaseException:
            backend.abort(request_id)
            if user is not None:
                self.store.delete_message(user.id)          # no orphan message
            raise
        after = self.prepared.after if len(params) == 1 and not beam else None
        return Turn(cid, request_id, replies, stream, backend.abort, self.store, on_done=after,
                    beam=bool(beam))

    def prompt_messages(self, cid: int, last_id: int | None) -> list[dict[str, str]]:
        """The engine's chat messages: the system prompt, then the path down to last_id."""
        path = self.store.path_to(last_id) if last_id is not None else []
        return chat_prompt(self.store.get_conversation(cid).system_prompt, path)

    # ---- open tabs, remembered across reloads and restarts (open_tabs.py) ------------------
    def open_tabs(self) -> list[int]:
        alive = {c.id for c in self.store.list_conversations()}
        return [c for c in self._open_tabs.read() if c in alive]

    def save_open_tabs(self, cids: list[int]) -> None:
        self._open_tabs.write(cids)


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 48 else line[:47].rstrip() + "…"

