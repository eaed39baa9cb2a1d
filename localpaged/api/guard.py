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
   (any user name, the password) or `Authorization: Bearer <secret>`; else 401 with a Basic
   challenge, which browsers answer with their own login prompt.
4. Security headers on every response: the Content-Security-Policy (see `CSP`), no framing,
   no MIME sniffing, no referrer.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

# What the Gradio page needs, and nothing more: its own scripts and styles (it inlines its config
# and theme CSS, and compiles event `js`), its own API over fetch/SSE (connect-src 'self'), images
# and media only from itself or data:/blob: (uploads, avatars), fonts from itself or data:.
# Remote images, scripts, styles, fonts, frames, plugins and connections are all blocked, so text a
# model writes can never make the browser send a request elsewhere.
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

    def authorized(self, authorization: str | None) -> bool:
        if not self.secrets:
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


class GuardMiddleware:
    """Pure ASGI (so SSE streams pass through untouched): checks, then adds security headers."""

    def __init__(self, app: ASGIApp, policy: GuardPolicy) -> None:
        self.app, self.policy = app, policy

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
        if not self.policy.authorized(headers.get("authorization")):
            return await self._refuse(scope, receive, send, 401, "login required")

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name in [k for k in out.keys() if k.startswith("access-control-")]:
                    del out[name]
                for name, value in SECURITY_HEADERS.items():
                    out[name] = value
            await send(message)

        await self.app(scope, receive, send_secured)

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
    Gradio mounted on it included). Returns app."""
    app.add_middleware(GuardMiddleware, policy=policy)
    app.state.guard_policy = policy
    return app
