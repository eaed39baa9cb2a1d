"""A script that runs first on the chat page, before Gradio's own modules (`EARLY_JS`), and the
ASGI middleware that writes it into the page (`EarlyScript`, `add_early_script`).

Why before Gradio: the script replaces `window.requestAnimationFrame`, which Gradio's status
tracker module reads once when it loads. Gradio's `head=` is applied by the page itself after
its config has loaded, which is too late; so the page's HTML gets the script as the first child
of `<head>`.

What it mends: Gradio's app loader shows a status tracker while the page loads; a "pending"
tracker runs a requestAnimationFrame loop (its elapsed-time counter), and when the loader goes
away the loop is not stopped, so the page asks for a frame sixty times a second for as long as
it is open, a steady cost on an idle page (bench/page_cost.py measures it; docs/benchmarks.md,
'The page's cost in the browser', has the figures).
Every event of this app hides its progress (event_settings.py), so no status tracker's counter is ever
shown: the script refuses the frames that status trackers ask for (it knows them by their
module, `statustracker-*.js`, in the caller's stack). Every other frame request is untouched.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

EARLY_JS = """(() => {
  const frame = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (callback) =>
    (new Error().stack || '').includes('/statustracker-') ? 0 : frame(callback);
})();"""
TAG = f"<script>{EARLY_JS}</script>".encode()


class EarlyScript:
    """Pure ASGI: in an HTML answer to a GET (Gradio's page), the script goes right after
    `<head>` (first match only); every other answer passes through untouched, streamed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []           # the start and body of an HTML answer, until its end

        async def send_patched(message: Message) -> None:
            if message["type"] == "http.response.start":
                if MutableHeaders(scope=message).get("content-type", "").startswith("text/html"):
                    held.append(message)
                    return
            elif held:
                held.append(message)
                if not message.get("more_body", False):
                    await self._send_with_script(held, send)
                return
            await send(message)

        await self.app(scope, receive, send_patched)

    @staticmethod
    async def _send_with_script(held: list[Message], send: Send) -> None:
        start, body = held[0], b"".join(m.get("body", b"") for m in held[1:])
        at = body.find(b"<head>")
        if at >= 0:
            body = body[:at + 6] + TAG + body[at + 6:]
        headers = MutableHeaders(scope=start)
        if "content-length" in headers:
            headers["content-length"] = str(len(body))
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})


def add_early_script(app) -> None:
    """Put EarlyScript in front of `app`'s routes (a FastAPI/Starlette app, before it starts)."""
    app.add_middleware(EarlyScript)
