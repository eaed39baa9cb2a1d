"""Who may reach the server: one ASGI middleware in front of every route (the Gradio UI, its
API/queue/upload/file routes, /v1, /metrics).

    guard_app(app, GuardPolicy.for_bind("127.0.0.1", allowed_hosts=["my-box.lan"]))

In order, for every HTTP and WebSocket request:
1. Host check (DNS rebinding): the Host header's name (port ignored) must be the bound address
   (for 0.0.0.0 / ::, this machine's host name and addresses), localhost, 127.0.0.1, [::1] or an
   `--allowed-hosts` name; else 403.
2. Origin check (CSRF, CORS): a request that carries an Origin must come from this server's own
   origin (the origin's host:port equals the Host header) or from an allowed host name; else
   403. So no foreign origin ever gets a response, let alone a CORS grant; `Access-Control-*`
   headers (Gradio adds its own) are stripped from every response as a second line.
3. Login, when the policy has secrets (a password and/or the API key): `Authorization: Basic`
   (any user name, the password), `Authorization: Bearer <secret>` or `x-api-key: <secret>`
   (Anthropic's clients); else 401 with a Basic
   challenge, which browsers answer with their own login prompt.
4. Gradio's file routes (`/gradio_api/file=`, its alias `/gradio_api/file/`, and the root
   `/file=` and `/file/` of older Gradio) serve only files inside the app's own directories
   (`gradio_file_roots`): a URL there (`http://`, `https://`, `//`) or any other path gets 403
   before Gradio sees it. Gradio itself would fetch a public URL server-side and stream it back,
   which would make `img-src 'self'` reach any host. Its `/proxy=` route (Spaces only) is
   refused outright.
5. Security headers on every response: the Content-Security-Policy (see `CSP`), no framing,
   no MIME sniffing, no referrer.

The body limit (body_limit.py) sits right behind the guard.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localpaged.api.body_limit import limit_bodies

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

# What the Gradio page needs, and nothing more: its own scripts and styles, its own API over
# fetch/SSE (connect-src 'self'), images and media only from itself or data:/blob: (uploads,
# avatars), fonts from itself or data:. Remote images, scripts, styles, fonts, frames, plugins and
# connections are all blocked, so text a model writes can never make the browser send a request
# elsewhere; and `/gradio_api/file=` (same origin, so inside img-src 'self') serves only the app's
# own files (GuardMiddleware), never a URL.
# Why the two script keywords stay (tried in Chromium on this app, Gradio 6):
# - 'unsafe-eval': Gradio compiles every event `js=` (ui/context/events.py's FOCUS_JS) with the
#   AsyncFunction constructor when the page loads, and one refusal leaves the page blank; and it
#   compiles every gr.HTML value as a Handlebars template with `Function` (each render fails
#   without it). Neither can be turned off from the app.
# - 'unsafe-inline': the page inlines five scripts: its config and API info (the frontend fetches
#   /config instead when they are blocked), `__gradio_mode__ = "app"`, the iframe resizer loader
#   and a body-padding fix. The page works without them, but each refusal is a CSP violation
#   report, and three of them embed the config, so no fixed hash covers them; only a per-response
#   nonce written into the page would (then 'unsafe-inline' is ignored, and inline event handlers
#   and javascript: URLs are blocked too).
CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline' 'unsafe-eval'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "media-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "worker-src 'self' blob:",
    "frame-src 'none'",
    "child-src 'none'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])
SECURITY_HEADERS = {"content-security-policy": CSP, "x-frame-options": "DENY",
                    "x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}


# Gradio's routes that read a file (or URL) named in the path, with and without its API prefix.
FILE_ROUTE = re.compile(r"^/(?:gradio_api/)?file[=/](?P<target>.*)$", re.DOTALL)
PROXY_ROUTE = re.compile(r"^/(?:gradio_api/)?proxy=")
URL_LIKE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|[/\\]{2})")    # scheme: or // or \\


def host_name(value: str) -> str:
    """The lower-case name of a Host header or bind address, without port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):                       # [::1]:7860
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:                       # name:port (a bare IPv6 has several colons)
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_loopback(host: str) -> bool:
    name = host_name(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False                 # a hostname: it may resolve to a public interface


def _own_names() -> set[str]:
    """This machine's host name and the addresses it resolves to (for a wildcard bind)."""
    try:
        name, aliases, addresses = socket.gethostbyname_ex(socket.gethostname())
    except OSError:
        return {socket.gethostname().lower()}
    return {n.lower() for n in (name, *aliases, *addresses)}


@dataclass(frozen=True)
class GuardPolicy:
    """allowed_hosts: host names (no ports) a request's Host may carry. secrets: passwords/keys
    any of which logs a request in; empty = no login."""

    allowed_hosts: frozenset[str]
    secrets: tuple[str, ...] = field(default=())
    # Origins from these names (any port) are accepted though they differ from the Host header:
    # the `--allowed-hosts` names, e.g. a reverse proxy's public name.
    origin_hosts: frozenset[str] = field(default=frozenset())

    @classmethod
    def for_bind(cls, bind_host: str, allowed_hosts: list[str] | tuple[str, ...] = (),
                 secrets: list[str | None] | tuple[str | None, ...] = ()) -> "GuardPolicy":
        extra = frozenset(host_name(h) for h in allowed_hosts if h.strip())
        names = {*LOOPBACK_NAMES, *extra}
        if host_name(bind_host) in ("0.0.0.0", "::", ""):   # every interface: this machine's names
            names |= _own_names()
        else:
            names.add(host_name(bind_host))
        return cls(frozenset(names), tuple(s for s in secrets if s), extra)

    def host_allowed(self, host: str | None) -> bool:
        return bool(host) and host_name(host) in self.allowed_hosts

    def origin_allowed(self, origin: str, host: str) -> bool:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False                             # "null", file:, chrome-extension: ...
        return parts.netloc.lower() == host.strip().lower() \
            or host_name(parts.netloc) in self.origin_hosts

    def authorized(self, authorization: str | None, api_key: str | None = None) -> bool:
        """A Bearer or Basic `Authorization` header holding a secret, or an `x-api-key` header
        (Anthropic's clients send only that) holding one."""
        if not self.secrets:
            return True
        if api_key is not None and any(hmac.compare_digest(api_key.strip().encode(), s.encode())
                                       for s in self.secrets):
            return True
        scheme, _, value = (authorization or "").partition(" ")
        value = value.strip()
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value, validate=True).decode().partition(":")[2]
            except (ValueError, UnicodeDecodeError):
                return False
        elif scheme.lower() != "bearer":
            return False
        return any(hmac.compare_digest(value.encode(), s.encode()) for s in self.secrets)


def gradio_file_roots(app) -> list[Path]:
    """The directories Gradio mounted on `app` serves files from: its upload and cache folder,
    its examples cache, the Blocks' allowed_paths and gr.set_static_paths. Empty without Gradio."""
    roots: list[str | Path] = []
    for route in getattr(app, "routes", []):
        sub = getattr(route, "app", None)
        if hasattr(sub, "uploaded_file_dir") and hasattr(sub, "get_blocks"):
            from gradio import utils
            from gradio.data_classes import _StaticFiles
            blocks = sub.get_blocks()
            roots += [sub.uploaded_file_dir, utils.get_cache_folder(),
                      *getattr(blocks, "allowed_paths", []), *_StaticFiles.all_paths]
    return [Path(os.path.realpath(r)) for r in roots]


def file_allowed(target: str, roots: list[Path]) -> bool:
    """Whether a file route may serve `target`: a local path (no URL) that resolves, links and
    `..` followed, to a place inside one of `roots`."""
    if not target or URL_LIKE.match(target):
        return False
    real = Path(os.path.realpath(target))
    return any(real.is_relative_to(root) for root in roots)


class GuardMiddleware:
    """Pure ASGI (so SSE streams pass through untouched): checks, then adds security headers.
    `file_roots` gives the directories the file routes may serve (none: every file refused)."""

    def __init__(self, app: ASGIApp, policy: GuardPolicy,
                 file_roots: Callable[[], list[Path]] = list) -> None:
        self.app, self.policy, self.file_roots = app, policy, file_roots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host, origin = headers.get("host", ""), headers.get("origin")
        if not self.policy.host_allowed(host):
            return await self._refuse(scope, receive, send, 403, "host not allowed: " + host)
        if origin is not None and not self.policy.origin_allowed(origin, host):
            return await self._refuse(scope, receive, send, 403, "cross-origin request refused")
        if not self.policy.authorized(headers.get("authorization"), headers.get("x-api-key")):
            return await self._refuse(scope, receive, send, 401, "login required")
        if scope["type"] == "http" and not self._path_allowed(scope.get("path", "")):
            return await self._refuse(scope, receive, send, 403,
                                      "file not served: only the app's own files are")

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name in [k for k in out.keys() if k.startswith("access-control-")]:
                    del out[name]
                for name, value in SECURITY_HEADERS.items():
                    out[name] = value
            await send(message)

        await self.app(scope, receive, send_secured)

    def _path_allowed(self, path: str) -> bool:
        path = "/" + path.lstrip("/")                  # //gradio_api/... as the router may read it
        if PROXY_ROUTE.match(path):
            return False
        match = FILE_ROUTE.match(path)
        return match is None or file_allowed(match["target"], self.file_roots())

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, text: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        extra = {"www-authenticate": 'Basic realm="localpaged", charset="UTF-8"'} \
            if status == 401 else {}
        await PlainTextResponse(text, status_code=status,
                                headers={**SECURITY_HEADERS, **extra})(scope, receive, send)


def guard_app(app, policy: GuardPolicy):
    """Put the guard in front of everything on `app` (a FastAPI/Starlette app, before it starts;
    Gradio mounted on it included), the body limit (body_limit.py) right behind it. Returns app."""
    limit_bodies(app)
    app.add_middleware(GuardMiddleware, policy=policy,      # added last: runs first
                       file_roots=lambda: gradio_file_roots(app))
    app.state.guard_policy = policy
    return app
