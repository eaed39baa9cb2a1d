"""Writes that must land (a reply's final text, status and stats): tried again with back-off
while the file cannot take them (busy past the timeout, disk full, read-only, damaged), until
one lands. The caller keeps what it writes in memory meanwhile.

Each attempt holds the store's lock at most ATTEMPT_WAIT_MS (`StoreBase.busy_wait`); the
back-off sleeps hold nothing, so other tabs' reads and writes go on between attempts. Call it
from a background thread (a turn's own), never from the event loop: it sleeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .db import StoreBase
from .errors import StoreError

log = logging.getLogger(__name__)

ATTEMPT_WAIT_MS = 250
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)       # after the last, every BACKOFF_S[-1] seconds


def until_saved(store: StoreBase, write: Callable[[], object], what: str,
                sleep: Callable[[float], None] = time.sleep) -> bool:
    """Run `write()` (store calls) until it lands: True then; False when its row is gone
    (KeyError: deleted meanwhile, nothing left to save). Raises StoreError at once when the
    store is closed, and whatever else `write` raises (a bug, not a state of the file)."""
    attempt = 0
    while True:
        try:
            with store.busy_wait(ATTEMPT_WAIT_MS):
                write()
        except KeyError as e:
            log.warning("%s was not saved: %s", what, e)
            return False
        except StoreError as e:
            if e.cause == "closed":
                raise
            if attempt == 0:
                log.warning("%s not saved yet, retrying until it is: %s", what, e)
            sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1
            continue
        if attempt:
            log.info("%s saved after %d retries", what, attempt)
        return True
