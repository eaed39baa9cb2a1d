"""A model load's progress: `reporting_progress(report)` and the steps a load reports at.

Inside `with reporting_progress(report):`, a load in that context (the thread that
calls it: LLM(...) loads in its caller's thread) calls `report(fraction, what)` as it goes:
fraction 0..1 of the load (LOAD_STEPS: files found, config and tokenizer, weights read tensor
by tensor or file by file, packed weights installed and float weights placed layer by layer;
the fractions never decrease), `what` a short phrase. It never
reaches 1.0 here: the engine still sizes its KV cache after the loader returns, so the
caller says when the model is ready. Outside such a block nothing is reported.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable

LoadProgress = Callable[[float, str], None]         # (fraction of the load done, what it does)
# Where each part of a load starts, as a fraction of the whole; reading the weights is most of it.
LOAD_STEPS = {"resolve": 0.0, "config": 0.03, "tokenizer": 0.06, "weights": 0.10,
              "install": 0.85, "place": 0.91, "finish": 0.97}
_PROGRESS: contextvars.ContextVar[LoadProgress | None] = contextvars.ContextVar(
    "localpaged_load_progress", default=None)


@contextlib.contextmanager
def reporting_progress(report: LoadProgress):
    """Loads in this context report to `report` (see the module doc); nested blocks: the inner."""
    token = _PROGRESS.set(report)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def report(step: str, what: str, done: int = 0, total: int = 0) -> None:
    """Progress at `step`, `done` of `total` units into it (the span up to the next step)."""
    sink = _PROGRESS.get()
    if sink is None:
        return
    steps = list(LOAD_STEPS)
    start = LOAD_STEPS[step]
    end = LOAD_STEPS[steps[steps.index(step) + 1]] if step != steps[-1] else 1.0
    fraction = start + (end - start) * (done / total if total else 0.0)
    sink(round(fraction, 4), f"{what} ({done}/{total})" if total else what)


def progress_of(step: str, what: str) -> Callable[[int, int], None]:
    return lambda done, total: report(step, what, done, total)
