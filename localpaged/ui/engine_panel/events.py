"""The engine panel's wiring: the server pushes the panel to the page when it changed; the page
never polls through Gradio.

A Gradio `Timer` (a tick a second) keeps an idle page busy: every tick is a client-side event
dispatch over the whole app state, even when the server answers "no change" (docs/benchmarks.md,
'The page's cost in the browser', has the figure). A Gradio generator that never ends keeps its
component's status tracker animating (and showing its timer). So the panel bypasses Gradio's
event machinery:
  - `panel_router` serves GET /lp/engine-panel?etag=E, a long poll: it answers as soon as the
    panel's HTML differs from the one with etag E (at once for a new page), or 204 after
    `LONG_POLL_S`. Waiting costs the page nothing; the server draws the snapshot every POLL_S.
  - `PANEL_JS` (run once at page load) loops on that request and puts the HTML into the panel,
    at most once every MIN_GAP_S.
The conversations drawn are the app's open tabs (`ChatController.open_tabs`), read on each poll.
The route sits behind the same host/origin checks and login as the page (api/guard.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time

from anyio import to_thread
from fastapi import APIRouter, Request, Response

from ..controller import ChatController
from .logic import KvMap
from .view import LIVE_CLASS, MIN_GAP_S, POLL_S, render_panel

log = logging.getLogger(__name__)

PANEL_PATH = "/lp/engine-panel"
LONG_POLL_S = 20.0

PANEL_JS = f"""() => {{
  if (window.__lpPanel) return; window.__lpPanel = true;
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  let etag = '';
  (async () => {{
    for (;;) {{
      try {{
        // a poll the server never answers (a dropped connection) is given up, not waited on
        const r = await fetch('{PANEL_PATH.lstrip("/")}?etag=' + encodeURIComponent(etag),
                              {{cache: 'no-store', credentials: 'same-origin',
                                signal: AbortSignal.timeout({int((LONG_POLL_S + 10) * 1000)})}});
        if (r.status === 200) {{
          const d = await r.json();
          const box = document.querySelector('#engine-panel .{LIVE_CLASS}');
          if (box) {{ box.innerHTML = d.html; etag = d.etag; }}
        }} else if (r.status !== 204) {{ await sleep(5000); }}
      }} catch (e) {{ await sleep(5000); }}
      await sleep({int(MIN_GAP_S * 1000)});
    }}
  }})();
}}"""


class PanelSource:
    """The panel's HTML now, and a wait for it to change."""

    def __init__(self, ctl: ChatController) -> None:
        self.ctl, self.kv = ctl, KvMap(ctl)

    def html(self) -> str | None:
        """None when drawing failed (logged; the page keeps what it shows)."""
        try:
            return render_panel(self.kv.collect(self.ctl.open_tabs()))
        except Exception:  # noqa: BLE001 - a panel refresh must never break the page
            log.exception("engine panel refresh failed")
            return None

    async def changed(self, etag: str, request: Request | None = None,
                      timeout: float = LONG_POLL_S) -> tuple[str, str] | None:
        """(etag, html) once the HTML's etag differs from `etag`; None after `timeout` or
        when the client went away."""
        deadline = time.monotonic() + timeout
        while True:
            html = await to_thread.run_sync(self.html)
            if html is not None and (tag := _etag(html)) != etag:
                return tag, html
            if time.monotonic() >= deadline or (request and await request.is_disconnected()):
                return None
            await asyncio.sleep(POLL_S)


def _etag(html: str) -> str:
    return hashlib.blake2b(html.encode(), digest_size=8).hexdigest()


def panel_router(ctl: ChatController) -> APIRouter:
    source, router = PanelSource(ctl), APIRouter()

    @router.get(PANEL_PATH, include_in_schema=False)
    async def engine_panel(request: Request, etag: str = "") -> Response:
        got = await source.changed(etag[:64], request)
        if got is None:
            return Response(status_code=204, headers={"Cache-Control": "no-store"})
        tag, html = got
        return Response(content=json.dumps({"etag": tag, "html": html}),
                        media_type="application/json",
                        headers={"Cache-Control": "no-store"})

    return router


def wire_engine_panel(loaded) -> None:
    """`loaded`: the page-load event; the panel's loop starts after it."""
    loaded.then(None, None, None, js=PANEL_JS)
