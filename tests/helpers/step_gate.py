"""StepGate: hold the engine thread inside a step until the test lets it go, so that what a test
does "while a request runs" (Stop, a disconnect, a model swap, reading the KV map) happens while
it runs by construction, not because the engine happened to be slower than the test.

The gate is a forward pre-hook on the model's `lm_head`: every step that samples calls it once
(whichever forward path ran: eager, the batch-1 loop or a graph; a request for prompt logprobs
adds a call), before the step's tokens are sampled. `StepGate(engine, step=k)` holds the k-th sampling step after it was made; the outputs
of the steps before it have been delivered by then (AsyncEngine delivers after each step), and
commands sent while it holds (submit, abort) take effect right after that step. Release is the
condition; `LIMIT_S` only bounds a test that forgot to release.
"""

from __future__ import annotations

import threading
import time

LIMIT_S = 30.0


class StepGate:
    def __init__(self, llm_engine, step: int = 1, module=None) -> None:
        """module: the module whose k-th call holds (default the lm_head: sampling steps; the
        embedding, `llm_engine.model.model.embed_tokens`, counts every forward, prefill chunks
        that sample nothing included)."""
        if step < 1:
            raise ValueError(f"step must be >= 1, got {step}")
        self.step = step
        self.calls = 0                      # calls seen since the gate was made
        self.held = threading.Event()       # set while the engine waits in the gate
        self._released = threading.Event()
        module = llm_engine.model.lm_head if module is None else module
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self.calls += 1
        if self.calls != self.step:
            return
        self.held.set()
        if not self._released.wait(LIMIT_S):
            raise AssertionError(f"StepGate: never released within {LIMIT_S} s")
        self.held.clear()

    def wait_held(self, timeout: float = LIMIT_S) -> None:
        """Until the engine waits in the gate (timeout: the failure limit)."""
        assert self.held.wait(timeout), (
            f"the engine never reached sampling step {self.step} ({self.calls} seen)")

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        """Release, and remove the hook: later steps run freely."""
        self.release()
        self._handle.remove()

    def __enter__(self) -> StepGate:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def shared_step(records, request_ids) -> bool:
    """Whether one step record (AsyncEngine.step_records) ran every one of request_ids."""
    wanted = set(request_ids)
    return any(wanted <= r.request_ids for r in records)


def poll(condition, what: str, timeout: float = LIMIT_S):
    """The condition's first truthy value, checked until the deadline (the failure limit)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)
