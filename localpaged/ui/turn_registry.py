"""TurnRegistry: which turn each conversation of the chat app runs (ui/turns.py: Turn).

At most one interactive turn per conversation, any number at once across conversations; a
conversation is busy from the reservation `launch` makes until its turn is done, so two sends
cannot both start. The controller, the chat turns, compare, the context features and the
prepared replies share one registry (ui/controller.py builds it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from localpaged.chat.backend import ChatBackend

from .turns import ChatError, Turn

log = logging.getLogger(__name__)

BUSY = "this conversation is still generating: stop it or wait"


class TurnRegistry:
    """Which turn each conversation runs: at most one interactive turn per conversation, any
    number at once across conversations. `launch` reserves the conversation (so two sends
    cannot both start), runs the `before_launch` hooks (the conversation's background work
    gives way), starts the turn and keeps it as the conversation's latest; `busy` is true from
    the reservation until that turn is done. Thread-safe: handlers of many pages call it."""

    def __init__(self) -> None:
        self._turns: dict[int, Turn] = {}          # conversation id -> its latest turn
        self._starting: set[int] = set()           # conversations whose turn is being set up
        self._lock = threading.Lock()
        self._before_launch: list[Callable[[int], None]] = []
        self._after_stop_all: list[Callable[[float], None]] = []

    def before_launch(self, hook: Callable[[int], None]) -> None:
        """hook(cid) runs before each new turn of conversation cid is made (it is reserved)."""
        self._before_launch.append(hook)

    def after_stop_all(self, hook: Callable[[float], None]) -> None:
        """hook(wait) runs at the end of `stop_all`."""
        self._after_stop_all.append(hook)

    def turn(self, cid: int) -> Turn | None:
        with self._lock:
            return self._turns.get(cid)

    def busy(self, cid: int) -> bool:
        with self._lock:
            return self._busy(cid)

    def _busy(self, cid: int) -> bool:
        turn = self._turns.get(cid)
        return cid in self._starting or (turn is not None and not turn.done)

    def check_idle(self, cid: int) -> None:
        if self.busy(cid):
            raise ChatError(BUSY)

    def launch(self, cid: int, backend: ChatBackend | None,
               start: Callable[[ChatBackend], Turn]) -> Turn:
        """The turn `start(backend)` makes, started; ChatError when there is no model yet or
        the conversation is busy (nothing is made then)."""
        if backend is None:
            raise ChatError("no model is loaded yet: wait for the model to finish loading")
        with self._lock:
            if self._busy(cid):
                raise ChatError(BUSY)
            self._starting.add(cid)
        try:
            for hook in self._before_launch:
                hook(cid)
            turn = start(backend)
            with self._lock:
                self._turns[cid] = turn
        finally:
            with self._lock:
                self._starting.discard(cid)
        return turn.start()

    def adopt(self, cid: int, turn: Turn) -> None:
        """A turn started elsewhere (a prepared reply still streaming, now shown) becomes the
        conversation's: it is busy until the turn is done, and a tab follows it."""
        with self._lock:
            self._turns[cid] = turn

    def stop(self, cid: int) -> bool:
        log.info("stop of conversation %d received", cid)     # its time: Stop's latency
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
        for hook in self._after_stop_all:
            hook(wait)
