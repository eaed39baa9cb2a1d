"""Turns: one generation ("turn") of the chat app, 1 to 4 replies decoded together in one engine
request over one shared prompt and consumed by a background thread that owns it. The registry of
the turns every conversation runs is `turn_registry.TurnRegistry`; how often a follower redraws,
`redraw.py`; one reply as the UI shows it and its stats, `live_reply.py`.

A Turn outlives the browser event that started it: Gradio handlers only *follow* a turn (see
`Turn.updates`), so a closed or reloaded page never cuts a reply short; the turn keeps writing
to the store. The store is written when the turn starts (replies with status 'streaming'), about
once a second while it streams, and when it ends ('complete' or 'stopped', with stats); a reply's
token ids are written with its text, always in step, so Continue can resume token-exact. The
final write is retried until it lands (a busy, full or read-only file); the turn is done once
it has.

Continue runs as a Turn too: its LiveReply starts from the stored reply (`prefix_ids`, text) and
the engine's new tokens join it; the whole text is decoded in one piece (`decode`).
While a long prompt is prefilled in chunks, `LiveReply.progress` is (computed, total) tokens.
A reasoning model's reply (a turn given its `reasoning` format) is split as it streams: the
answer is the reply's text (`content` in the store), the reasoning `LiveReply.reasoning` (the
row's `extra.reasoning`), its token count `stats.reasoning_tokens`.
A turn whose prompt has images (its engine ImagePrompt, `images`) marks each reply's stats
`images_from_cache` when the prefix cache served every image (chat/images.py): neither the
vision encoder nor the images' prefill ran for it; and `image_tower_runs`, how many times the
vision tower ran for it (RequestMetrics.num_encoder_runs: 0 when the encoder cache had them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from localpaged.chat.reasoning import ReasoningFormat
from localpaged.engine.multimodal import ImagePrompt
from localpaged.engine.outputs import RequestOutput

from .live_reply import LiveReply, reply_stats
from .redraw import FOREGROUND_S
from .store import Store
from .store.retry import until_saved

log = logging.getLogger(__name__)

STORE_WRITE_INTERVAL_S = 1.0


class ChatError(Exception):
    """Something the user asked for that cannot be done now; the message says why."""


class Turn:
    """One request in one conversation; `replies[i]` is column i. `on_done(turn)` runs on the
    turn's thread once it is done (saved); `beam` turns keep each beam's score in its stats."""

    def __init__(self, conversation_id: int, request_id: str, replies: list[LiveReply],
                 stream: Iterator[RequestOutput], abort, store: Store,
                 on_done: Callable[["Turn"], None] | None = None, beam: bool = False,
                 decode=None, reasoning: ReasoningFormat | None = None,
                 images: ImagePrompt | None = None) -> None:
        self.on_done, self.beam = on_done, beam
        self._images = images               # the prompt's images, to say if they were cached
        self.conversation_id = conversation_id
        self.request_id = request_id
        self.replies = replies
        self.error: str | None = None
        self.done = False
        # The turn that carries this one's work on (a compaction's reply: context/compact.py),
        # set before this one is done; `updates` and `wait` go on into it.
        self.then: Turn | None = None
        self.version = 0
        self.started = time.monotonic()
        self._stream, self._abort, self._store = stream, abort, store
        self._decode = decode               # token ids -> text; needed to continue a reply
        self._reasoning = reasoning         # splits the replies' reasoning from their answers
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._first_token: dict[int, float] = {}
        # a continued reply's reasoning tokens before this turn (its new request counts its own)
        self._prefix_reasoning = [int(r.stats.get("reasoning_tokens") or 0) if r.prefix_ids else 0
                                  for r in replies]
        self._thread = threading.Thread(target=self._run, name=f"turn-{request_id}", daemon=True)

    def start(self) -> "Turn":
        self._thread.start()
        return self

    @classmethod
    def finished(cls, conversation_id: int, reply: LiveReply, store: Store) -> "Turn":
        """A turn that is already done: a reply that needs no request (one prepared before)."""
        turn = cls(conversation_id, f"ready-{reply.message_id}", [reply], iter(()),
                   lambda _rid: None, store)
        turn.done = True
        return turn

    def stop(self) -> None:
        """Ask the engine to abort; the replies keep their text and become 'stopped'."""
        self._stop.set()
        try:
            self._abort(self.request_id)
        except Exception:  # noqa: BLE001 - the stop flag alone ends the loop
            log.exception("abort of %s failed", self.request_id)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until this turn and those it hands on to (`then`) are done."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if not self._cond.wait_for(lambda: self.done, timeout):
                return False
        if self.then is None:
            return True
        return self.then.wait(None if end is None else max(0.0, end - time.monotonic()))

    @property
    def final(self) -> "Turn":
        """The last turn of the chain this one starts (itself when it hands on to none)."""
        turn = self
        while turn.then is not None:
            turn = turn.then
        return turn

    def updates(self, interval: float | Callable[[], float] = FOREGROUND_S) -> Iterator["Turn"]:
        """Yield self whenever it changed, at most every `interval` s (a callable is asked
        again every FOREGROUND_S of the pause, so a reply whose tab goes to the background
        slows down and one brought to the front redraws at once), and a last time as soon as
        it is done. Nothing is yielded while nothing changed: an unchanged reply costs the page
        nothing. Until the first text arrives there is no throttle: the first token shows as
        soon as the engine step that sampled it ends. Then the updates of the turn it handed
        on to (`then`), if any."""
        seen = -1
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self.version != seen or self.done)
                seen, done = self.version, self.done
            yield self
            if done:
                break
            if self._first_token:
                self._pause(interval if callable(interval) else lambda: interval)
        if self.then is not None:
            yield from self.then.updates(interval)

    def _pause(self, interval: Callable[[], float]) -> None:
        """Sleep until `interval()` s have passed since the call (asked every FOREGROUND_S) or
        the turn is done."""
        start = time.monotonic()
        while not self.done:
            left = interval() - (time.monotonic() - start)
            if left <= 0:
                return
            time.sleep(min(left, FOREGROUND_S))

    # ---- the turn's thread ----------------------------------------------------------------
    def _run(self) -> None:
        self._finish(self._consume())

    def _consume(self) -> RequestOutput | None:
        """Apply the stream to the replies until it ends, fails (`error`) or is stopped; the
        last output (None: none came)."""
        last_write, out = time.monotonic(), None
        try:
            for out in self._stream:
                self._apply(out)
                if time.monotonic() - last_write >= STORE_WRITE_INTERVAL_S:
                    self._write_partial()
                    last_write = time.monotonic()
                if self._stop.is_set():
                    break
        except Exception as exc:  # noqa: BLE001 - shown to the user, the text is kept
            log.warning("generation %s failed: %s", self.request_id, exc)
            self.error = str(exc) or type(exc).__name__
        finally:
            close = getattr(self._stream, "close", None)
            if close:
                close()                   # an unfinished stream aborts its request
        return out

    def _apply(self, out: RequestOutput) -> None:
        now = time.monotonic()
        with self._cond:
            if out.prefilling and out.num_computed_prompt_tokens > 0:
                for reply in self.replies:
                    reply.progress = (out.num_computed_prompt_tokens, out.num_prompt_tokens)
            for i, comp in enumerate(out.outputs[:len(self.replies)]):
                reply = self.replies[i]
                if comp.text and i not in self._first_token:
                    self._first_token[i] = now
                new_ids = list(comp.token_ids or [])
                text = None                        # the whole reply's text, when it changed
                if reply.prefix_ids:               # Continue: the new tokens join the reply
                    reply.token_ids = reply.prefix_ids + new_ids
                    if new_ids:
                        text = self._decode(reply.token_ids)
                else:
                    reply.token_ids = new_ids or None
                    text = comp.text
                if comp.logprobs is not None:
                    reply.logprobs = comp.logprobs
                if text is not None:
                    reply.text = text
                    if self._reasoning is not None:
                        self._split(reply, out.prompt_token_ids or [])
                reply.stats = reply_stats(out, i, now, self._first_token.get(i), self.started,
                                          self._images, self.beam)
                reply.stats["generated_tokens"] += len(reply.prefix_ids)
                if self._prefix_reasoning[i]:
                    reply.stats["reasoning_tokens"] = (reply.stats.get("reasoning_tokens", 0)
                                                       + self._prefix_reasoning[i])
            self.version += 1
            self._cond.notify_all()

    def _split(self, reply: LiveReply, prompt_ids: list[int]) -> None:
        """reply.text (the whole reply) into its answer and its reasoning; a continued reply's
        prompt ends with its earlier tokens, so the reasoning opened before them."""
        cut = len(prompt_ids) - len(reply.prefix_ids)
        split = self._reasoning.split(reply.text, prompt_ids[:cut])
        reply.text, reply.reasoning = split.content, split.reasoning

    def _write_partial(self) -> None:
        for reply in self.replies:
            try:
                self._store.update_message(reply.message_id, content=reply.text,
                                           token_ids=reply.token_ids, extra=reply.extra())
            except Exception:  # noqa: BLE001 - the final write retries; keep streaming
                log.exception("could not save the partial reply %d", reply.message_id)

    def _finish(self, out: RequestOutput | None) -> None:
        self._save_replies(out, self.replies)
        self._end()

    def _save_replies(self, out: RequestOutput | None, replies: list[LiveReply],
                      extra: dict | None = None) -> None:
        """Each reply's final status ('complete', or 'stopped' when stopped, failed or cut
        short), written until it lands; `extra` goes into each reply's row."""
        stopped = self._stop.is_set() or self.error is not None
        for i, reply in enumerate(replies):
            reason = out.outputs[i].finish_reason if out and i < len(out.outputs) else None
            reply.status = "stopped" if stopped or reason in (None, "abort") else "complete"
            if self.error:
                reply.stats["error"] = self.error
            self._save_final(reply, extra)

    def _end(self) -> None:
        """on_done, then done (followers see the last version)."""
        if self.on_done is not None:
            try:
                self.on_done(self)
            except Exception:  # noqa: BLE001 - the turn itself is saved; say what failed
                log.exception("after turn %s", self.request_id)
        with self._cond:
            self.done = True
            self.version += 1
            self._cond.notify_all()

    def _save_final(self, reply: LiveReply, extra: dict | None = None) -> None:
        """Write the reply's last state, retried until it lands (`until_saved`). Until then
        the turn is not done: the UI keeps showing the reply from memory, and the
        conversation stays busy, so nothing is built on a reply the store does not hold."""
        drop = bool(self.error) and not reply.text and not reply.prefix_ids  # nothing to keep

        def write() -> None:
            if drop:
                self._store.delete_message(reply.message_id)
            else:
                kept = {**(reply.extra() or {}), **(extra or {})} or None
                self._store.update_message(reply.message_id, content=reply.text,
                                           status=reply.status, stats=reply.stats,
                                           token_ids=reply.token_ids, extra=kept)
                if (choices := reply.choices()) is not None:
                    self._store.set_alternatives(reply.message_id, choices)
        try:
            until_saved(self._store, write, f"reply {reply.message_id}")
        except Exception as exc:  # noqa: BLE001 - a closed store or a bug: say so, keep going
            log.exception("could not save reply %d", reply.message_id)
            self.error = self.error or f"could not save the reply: {exc}"
            return
        if drop:
            reply.status = "deleted"
