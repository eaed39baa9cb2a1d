"""Request body limits on the bytes actually read, whatever the framing (Content-Length or
chunked), on every route: /v1, Gradio's upload and queue routes, everything else.

    limit_bodies(app)        # once; guard_app and build_app both call it (it is idempotent)

A pure ASGI layer counts the `http.request` body bytes the app pulls through `receive`. A body
announced (Content-Length) as longer than its route's limit is refused before a byte is read;
a body that grows past it while being read is refused the moment it does: the client gets 413
and the app gets `http.disconnect` (so it stops reading), and whatever the app answers after
that is dropped. /v1 refusals carry the OpenAI error object errors.py builds; others are plain
text.

Limits (`limit_for`): every route takes at most MAX_BODY_BYTES (errors.py, 32 MiB): an API
request's JSON (a prompt of any context length is far below it) and Gradio's queue payloads alike.
Gradio's upload route gets UPLOAD_BODY_BYTES, the same 32 MiB: the UI has no upload component
(its one gr.File only offers exports for download), and Gradio's own `max_file_size` is unset,
so this is the only cap there. Raise UPLOAD_BODY_BYTES if the UI ever takes files.
"""

from __future__ import annotations

import json
import logging

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localpaged.api.errors import MAX_BODY_BYTES, APIError

logger = logging.getLogger(__name__)

UPLOAD_BODY_BYTES = 32 * 2**20
UPLOAD_PATHS = ("/gradio_api/upload",)


def limit_for(path: str) -> int:
    """The most body bytes a request to `path` may send."""
    return UPLOAD_BODY_BYTES if path.rstrip("/") in UPLOAD_PATHS else MAX_BODY_BYTES


def too_large(path: str, limit: int, size: int | None = None) -> tuple[bytes, str]:
    """The 413 body and its media type: OpenAI's error object on /v1, plain text elsewhere."""
    told = f"is {size} bytes" if size is not None else "is longer than that"
    message = f"The request body {told}; at most {limit} bytes are accepted here."
    if path.startswith("/v1/") or path == "/v1":
        body = APIError(message, 413, code="request_too_large").body()
        return json.dumps(body).encode(), "application/json"
    return message.encode(), "text/plain; charset=utf-8"


class BodyLimitMiddleware:
    """Counts each request's body bytes; past its route's limit, answers 413 itself.

    Invariant: once `refused` is set, the 413 has been sent (or a response was already under way,
    which is then cut short) and nothing the app sends reaches the client.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, limit = scope.get("path", ""), limit_for(scope.get("path", ""))
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _answer(send, *too_large(path, limit, int(declared)))
            return
        await _CountedRequest(self.app, path, limit, receive, send).run(scope)


class _CountedRequest:
    """One request's body count and its refusal state."""

    def __init__(self, app: ASGIApp, path: str, limit: int, receive: Receive, send: Send) -> None:
        self.app, self.path, self.limit = app, path, limit
        self._receive, self._send = receive, send
        self.read = 0
        self.started = False             # the app (or we) began a response
        self.refused = False

    async def run(self, scope: Scope) -> None:
        try:
            await self.app(scope, self.receive, self.send)
        except Exception:  # noqa: BLE001 - an app that fails on the disconnect we gave it
            if not self.refused:
                raise
            logger.debug("%s failed after its body was refused", self.path, exc_info=True)

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.limit:
                await self._refuse()
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def _refuse(self) -> None:
        logger.info("refused a request body past %d bytes on %s", self.limit, self.path)
        self.refused = True
        if self.started:                 # too late for a status: end the response here
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await _answer(self._send, *too_large(self.path, self.limit))


async def _answer(send: Send, body: bytes, media_type: str) -> None:
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", media_type.encode()),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def limit_bodies(app) -> None:
    """Put the body limit in front of `app`'s routes (before it starts), once."""
    if getattr(app.state, "body_limited", False):
        return
    app.add_middleware(BodyLimitMiddleware)
    app.state.body_limited = True
