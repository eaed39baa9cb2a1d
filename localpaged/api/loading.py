"""The server while the app starts: the port answers at once, the model loads behind it.

`LoadingGate` is the ASGI app uvicorn serves from the first second. Until `open(app)` hands it
the real app (the FastAPI app with the chat UI mounted, built once the model is loaded) it
answers by itself:
  GET /startup/status   the start-up's progress as JSON (`StartupProgress.snapshot`); after
                        the start, `{"ready": true, ...}`, so a loading page can tell when to
                        reload
  /v1/..., /metrics     503 with an OpenAI-style error object and Retry-After: the model is not
                        loaded yet
  anything else         the loading page (503, HTML): it polls /startup/status, shows what is
                        happening and reloads itself into the chat page when the app is ready
Once open, every request goes to the real app, whose lifespan (Gradio's queue and start-up
events) the gate runs in the server's event loop: entered by `open`, left at shutdown.

`StartupProgress` is written by the loading thread (`report`, and `LogTap`, which turns the
`localpaged` loggers' INFO lines, such as the CPU extension's and the weights', into steps) and
read by the gate; one lock guards it. Model names and log lines are server text: the page puts
them in with textContent, never as HTML.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.responses import HTMLResponse, JSONResponse
from starlette.types import Receive, Scope, Send

from localpaged.api.errors import APIError

log = logging.getLogger(__name__)

STATUS_PATH = "/startup/status"
API_PREFIXES = ("/v1", "/metrics")
MAX_STEPS = 40                       # the page lists the latest this many steps
RETRY_AFTER_S = "2"
_PERCENT = re.compile(r"(\d{1,3}(?:\.\d+)?)\s*%")


class StartupProgress:
    """What the start-up is doing: the current phase and detail, the steps so far (seconds
    since the start, text), and at the end `ready` or `error`."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self.phase, self.detail = "starting", ""
        self.steps: list[tuple[float, str]] = []
        self.ready_s: float | None = None
        self.error: str | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def report(self, phase: str, detail: str = "") -> None:
        """The start-up moved on (a new phase, or the same one further: a new detail)."""
        with self._lock:
            new_phase = phase != self.phase
            self.phase, self.detail = phase, detail
            if new_phase:
                self._step(f"{phase}: {detail}" if detail else phase)

    def note(self, text: str) -> None:
        """A step that changes no phase (a log line)."""
        with self._lock:
            self._step(text)

    def _step(self, text: str) -> None:
        self.steps.append((round(self.elapsed(), 1), text))
        del self.steps[:-MAX_STEPS]

    def finish(self, error: str | None = None) -> None:
        with self._lock:
            self.error = error
            if error is None:
                self.ready_s = self.elapsed()
                self.phase, self.detail = "ready", ""
            else:
                self.phase, self.detail = "failed", error
            self._step(self.phase if error is None else f"failed: {error}")

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            match = _PERCENT.search(self.detail)
            return {"ready": self.ready_s is not None, "model": self.model, "phase": self.phase,
                    "detail": self.detail, "percent": float(match[1]) if match else None,
                    "elapsed_s": round(self.elapsed(), 1), "error": self.error,
                    "steps": [{"at_s": at, "text": text} for at, text in self.steps]}


class LogTap(logging.Handler):
    """INFO and above from the `localpaged` loggers below the top one, as steps of `progress`,
    while attached (the top logger is the CLI's, whose lines repeat the reported phases)."""

    def __init__(self, progress: StartupProgress) -> None:
        super().__init__(logging.INFO)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "localpaged":
            return
        try:
            self.progress.note(record.getMessage())
        except Exception:  # noqa: BLE001 - a log line must never break the start-up
            self.handleError(record)

    def __enter__(self) -> LogTap:
        logging.getLogger("localpaged").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("localpaged").removeHandler(self)


class LoadingGate:
    """The ASGI app in front of the real one (see the module's docstring)."""

    def __init__(self, progress: StartupProgress, page_html: str) -> None:
        self.progress, self.page_html = progress, page_html
        self.app = None                                  # the real app, once open
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lifespan: AbstractAsyncContextManager | None = None

    def open(self, app, timeout: float = 120.0) -> None:
        """From the loading thread: run `app`'s lifespan in the server's loop, then route every
        request to it."""
        if self._loop is None:
            raise RuntimeError("the server has not started")
        asyncio.run_coroutine_threadsafe(self._enter(app), self._loop).result(timeout)

    async def _enter(self, app) -> None:
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        self._lifespan, self.app = lifespan, app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self._serve_lifespan(receive, send)
        if scope["type"] == "http" and scope.get("path") == STATUS_PATH:
            return await JSONResponse(self.progress.snapshot(),
                                      headers={"Cache-Control": "no-store"})(scope, receive, send)
        if self.app is not None:
            return await self.app(scope, receive, send)
        if scope["type"] != "http":                      # a websocket before the app exists
            await send({"type": "websocket.close", "code": 1013})      # "try again later"
            return
        await self._loading_response(scope["path"])(scope, receive, send)

    def _loading_response(self, path: str):
        headers = {"Retry-After": RETRY_AFTER_S, "Cache-Control": "no-store"}
        if path.startswith(API_PREFIXES):
            snap = self.progress.snapshot()
            what = "failed to load" if snap["error"] else f"is loading ({snap['phase']})"
            response = APIError(f"The model {what}: the API answers once it is ready.", 503,
                                "service_unavailable", code="model_loading").response()
            response.headers.update(headers)
            return response
        return HTMLResponse(self.page_html, status_code=503, headers=headers)

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._loop = asyncio.get_running_loop()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._lifespan is not None:
                    try:
                        await self._lifespan.__aexit__(None, None, None)
                    except Exception:  # noqa: BLE001 - shut down whatever else remains
                        log.exception("the app's shutdown failed")
                await send({"type": "lifespan.shutdown.complete"})
                return
