"""Alternatives ready before you ask: when a reply finishes, the app generates k more
replies to the same prompt at *background* priority (localpaged/core/scheduler.py: they only use
capacity interactive work leaves) and stores them as siblings marked prepared. Regenerate and
‹ › then show one without a new request.

This module owns, per conversation: the options (`alternatives`: 0..3, None for the device
default, 1 on a GPU and 0 on a CPU; `keep_unopened`), the background turn (at most one), its
cancellation, revealing a prepared reply, and which siblings the ‹ › control counts. It is
given the turn registry (which cancels the background turn before any interactive turn of the
conversation starts, and at `stop_all`), the store, the backend and the settings reader.

Invariants:
- A background turn never changes the shown path: its replies are added inactive, with
  `prepared='unseen'`; only `reveal`/`opened` (a user action) make one active, and mark it 'seen'.
- Its prompt is the very prompt of the reply it follows (same messages, same token ids), so the
  prefix cache hands it the prompt's blocks (shared by reference, not recomputed).
- Any new interactive generation in the conversation (send, edit, compare, a regenerate that
  finds nothing prepared), closing its tab, deleting it or stopping the app first cancels the
  background turn: the engine aborts it (its blocks are freed) and its unseen replies go.
- An unseen prepared reply that is still streaming is not counted among siblings.
- Finished unseen replies stay (marked) unless the conversation's `keep_unopened` is off: then
  they are dropped when the user moves on (a new message, an edit, closing the tab).
- A crash mid-preparation leaves nothing half-made: `Store.mark_interrupted` at start-up deletes
  unseen replies still marked streaming.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localpaged.chat.backend import ChatBackend, is_local, reasoning_of, with_thinking

from ..context.logic import ContextError, fit_prompt, prompt_messages
from ..settings.logic import ConversationSettings, sampling_record
from ..store import Store
from ..turn_registry import TurnRegistry
from ..live_reply import LiveReply
from ..turns import Turn

log = logging.getLogger(__name__)

MAX_ALTERNATIVES = 3
BACKGROUND = "background"


@dataclass
class PrepareOptions:
    """A conversation's options for prepared replies (stored in `conversations.options`)."""
    alternatives: int | None = None     # 0..MAX_ALTERNATIVES; None: the device's default
    keep_unopened: bool = True          # keep prepared replies never opened (else drop them)


def clean_options(alternatives: Any, keep_unopened: Any) -> PrepareOptions:
    """ValueError naming the field when a value is not supported."""
    if alternatives in (None, "", "auto"):
        k = None
    else:
        try:
            k = int(alternatives)
        except (TypeError, ValueError):
            k = -1
        if not 0 <= k <= MAX_ALTERNATIVES:
            raise ValueError(f"alternatives must be 'auto' or 0 to {MAX_ALTERNATIVES}, "
                             f"not {alternatives!r}")
    if not isinstance(keep_unopened, bool):
        raise ValueError(f"keep_unopened must be true or false, not {keep_unopened!r}")
    return PrepareOptions(k, keep_unopened)


def default_alternatives(backend) -> int:
    """1 on a GPU, 0 on a CPU (where background decoding would slow the reply being read);
    0 over a remote backend (no priorities there)."""
    if not is_local(backend):
        return 0
    return 1 if backend.engine.info.device == "cuda" else 0


class PreparedReplies:
    def __init__(self, turns: TurnRegistry, store: Store,
                 backend: Callable[[], ChatBackend | None], settings: ConversationSettings) -> None:
        self.turns, self.store, self.backend, self.settings = turns, store, backend, settings
        self._background: dict[int, Turn] = {}   # conversation id -> its background turn
        self._lock = threading.Lock()
        turns.before_launch(self.cancel)         # new interactive work: the user moved on
        turns.after_stop_all(self.cancel_all)

    # ---- options ------------------------------------------------------------------------------
    def options(self, cid: int) -> PrepareOptions:
        raw = self.store.get_conversation(cid).options
        return clean_options(raw.get("alternatives"), raw.get("keep_unopened", True))

    def set_options(self, cid: int, alternatives: Any, keep_unopened: Any):
        """Raises ValueError naming a bad field; nothing is saved then."""
        opts = clean_options(alternatives, keep_unopened)
        conv = self.store.get_conversation(cid)
        new = {**conv.options, "alternatives": opts.alternatives,
               "keep_unopened": opts.keep_unopened}
        return conv if new == conv.options else self.store.update_conversation(cid, options=new)

    def alternatives(self, cid: int) -> int:
        """How many alternatives this conversation prepares now (0 over a remote backend)."""
        backend = self.backend()
        if not is_local(backend):
            return 0
        k = self.options(cid).alternatives
        return default_alternatives(backend) if k is None else k

    # ---- preparing ----------------------------------------------------------------------------
    def after(self, turn: Turn) -> None:
        """Turn.on_done of a one-reply interactive turn: prepare alternatives to its reply."""
        reply = turn.replies[0]
        if turn.error or reply.status != "complete":
            return
        cid = turn.conversation_id
        try:
            k = self.alternatives(cid)
            if k:
                self.start(cid, self.store.get_message(reply.message_id).parent_id, k)
        except Exception:  # noqa: BLE001 - a missing alternative is no reason to fail the turn
            log.exception("could not prepare alternatives in conversation %d", cid)

    def start(self, cid: int, parent_id: int, k: int) -> Turn | None:
        """k replies to `parent_id` at background priority, stored inactive and unseen. Seeds
        (when the conversation sets one) are seed+1..seed+k: not the reply's own seed."""
        backend = with_thinking(self.backend(), self.settings.thinking(cid))
        if not is_local(backend) or not 1 <= k <= MAX_ALTERNATIVES:
            return None
        self.cancel(cid, moving_on=False)
        params = self.settings.sampling(cid).columns(k, first_seed=1)
        prompt = prompt_messages(self.store, cid, parent_id)
        try:       # fitted like the reply it follows, so it shares that prompt's cached blocks
            sent = fit_prompt(backend, prompt, params[0].max_tokens,
                              self.store.get_conversation(cid).context_policy)
        except ContextError:
            return None
        request_id = f"prep{cid}-{uuid.uuid4().hex[:8]}"
        stream = backend.chat(sent.messages, params, request_id=request_id, priority=BACKGROUND)
        stats = {"context_dropped": sent.dropped} if sent.dropped else {}
        if getattr(backend, "model_name", None):          # the model that writes the reply
            stats["model"] = backend.model_name
        try:
            replies = [LiveReply(self.store.add_message(
                cid, parent_id, "assistant", "", sampling_record(p), status="streaming",
                stats=stats, prepared="unseen", activate=False).id) for p in params]
        except BaseException:
            backend.abort(request_id)
            raise
        turn = Turn(cid, request_id, replies, stream, backend.abort, self.store,
                    on_done=self._finished, reasoning=reasoning_of(backend))
        with self._lock:
            self._background[cid] = turn
        return turn.start()

    def turn(self, cid: int) -> Turn | None:
        with self._lock:
            return self._background.get(cid)

    def _finished(self, turn: Turn) -> None:
        """A background turn ended: replies cut off before anyone opened them are deleted."""
        for reply in turn.replies:
            if reply.status == "complete" or reply.status == "deleted":
                continue
            try:
                if self.store.get_message(reply.message_id).prepared == "unseen":
                    self.store.delete_message(reply.message_id)
                    reply.status = "deleted"
            except KeyError:
                pass                                  # the conversation went meanwhile

    # ---- cancelling ---------------------------------------------------------------------------
    def cancel(self, cid: int, moving_on: bool = True, wait: float = 0.0) -> bool:
        """Abort the conversation's unfinished background turn (its blocks are freed); when the
        user moves on and `keep_unopened` is off, drop the finished unseen replies too. Returns
        whether a turn was running."""
        with self._lock:
            turn = self._background.pop(cid, None)
        running = turn is not None and not turn.done
        if running:
            turn.stop()
            turn.wait(wait)
        if moving_on:
            try:
                if not self.options(cid).keep_unopened:
                    for m in self.store.messages(cid):
                        if m.prepared == "unseen" and m.status != "streaming":
                            self.store.delete_message(m.id)
            except KeyError:
                pass
        return running

    def cancel_all(self, wait: float = 0.0) -> None:
        with self._lock:
            cids = list(self._background)
        for cid in cids:
            self.cancel(cid, moving_on=False, wait=wait)

    # ---- showing ------------------------------------------------------------------------------
    def reveal(self, parent_id: int) -> Turn | None:
        """Regenerate with something prepared: show the first unseen prepared reply to
        `parent_id` (a finished one first, else one still streaming, whose turn becomes the
        conversation's interactive one) and return a turn to follow, with no new request; None
        when nothing is prepared."""
        unseen = [m for m in self.store.children(parent_id) if m.prepared == "unseen"]
        cid = self.store.get_message(parent_id).conversation_id
        done = [m for m in unseen if m.status == "complete"]
        bg = self.turn(cid)
        live = [r for r in (bg.replies if bg and not bg.done else [])
                if r.message_id in {m.id for m in unseen}]
        if done:
            m = self.opened(done[0].id)
            return Turn.finished(cid, LiveReply(m.id, m.content, m.status, m.stats), self.store)
        if live:
            self.opened(live[0].message_id)
            if not bg.done:
                self.turns.adopt(cid, bg)            # the tab follows it
            return bg
        return None

    def opened(self, message_id: int):
        """The user now sees this message: make it active; a prepared one becomes 'seen'."""
        m = self.store.get_message(message_id)
        if m.prepared == "unseen":
            m = self.store.update_message(message_id, prepared="seen")
        self.store.set_active(message_id)
        return m

    def visible_siblings(self, message_id: int) -> tuple[list[int], int]:
        """store.siblings without unseen prepared replies still streaming (the message itself
        always counts)."""
        m = self.store.get_message(message_id)
        kids = self.store.children(m.parent_id, m.conversation_id)
        ids = [c.id for c in kids
               if c.id == message_id or not (c.prepared == "unseen" and c.status == "streaming")]
        return ids, ids.index(message_id)
