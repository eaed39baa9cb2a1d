"""Who may reach the app: the whole app as `localpaged` builds it (Gradio UI mounted on the API,
tiny random model, temp data dir) served by uvicorn in a thread, probed over real HTTP.

Checks on every kind of route (the UI page, Gradio's config/API/queue/upload/file routes, /v1,
/metrics): a foreign Host gets 403 (DNS rebinding), a foreign Origin gets 403 and never a CORS
grant (preflight and simple request), a login refuses unauthenticated requests (Basic and
Bearer accepted), the page carries the Content-Security-Policy, and a non-loopback bind
without a login refuses to start.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import logging
import select
import socket
import threading

import pytest

from localpaged import cli
from localpaged.api.errors import MAX_BODY_BYTES
from localpaged.api.guard import CSP, GuardPolicy, host_name
from localpaged.api.security import login_secrets, require_login_for_bind
from localpaged.api.server import make_server, start_in_thread

PASSWORD = "correct horse"
API_KEY = "sk-test-key"
# (method, path, body): one route of each kind; all must be guarded.
ROUTES = [("GET", "/", None), ("GET", "/config", None), ("GET", "/gradio_api/info", None),
          ("POST", "/gradio_api/queue/join", b"{}"), ("POST", "/gradio_api/upload", b""),
          ("GET", "/gradio_api/file=/etc/passwd", None), ("GET", "/v1/models", None),
          ("GET", "/metrics", None)]
OPEN_ROUTES = [("GET", "/", None), ("GET", "/config", None), ("GET", "/v1/models", None),
               ("GET", "/metrics", None)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tiny_llama, tmp_path_factory):
    port = _free_port()
    args = cli.parse_args(["--model", tiny_llama, "--data-dir", str(tmp_path_factory.mktemp("d")),
                           "--port", str(port), "--num-kv-blocks", "64", "--password", PASSWORD,
                           "--api-key", API_KEY, "--allowed-hosts", "my-box.lan, other.lan"])
    app, ctl, models, store = cli.build(args)
    server = make_server(app, "127.0.0.1", port, log_level="warning")
    thread = start_in_thread(server, timeout=120)
    yield port
    server.should_exit = True
    thread.join(10)
    ctl.stop_all(wait=5.0)
    models.backend.engine.shutdown()
    store.close()
    app.state.instance_lock.release()


def request(port: int, method: str, path: str, body: bytes | None = None, *,
            host: str | None = None, auth: str | None = "bearer", origin: str | None = None,
            extra: dict | None = None) -> http.client.HTTPResponse:
    headers = {"Host": host or f"127.0.0.1:{port}", **(extra or {})}
    if auth == "basic":
        headers["Authorization"] = "Basic " + base64.b64encode(f"me:{PASSWORD}".encode()).decode()
    elif auth == "bearer":
        headers["Authorization"] = f"Bearer {API_KEY}"
    elif auth is not None:
        headers["Authorization"] = auth
    if origin is not None:
        headers["Origin"] = origin
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_a_foreign_host_is_refused_on_every_route(served, method, path, body):
    for host in ("attacker.example", f"attacker.example:{served}", "127.0.0.1.attacker.example",
                 "192.168.1.5"):
        resp = request(served, method, path, body, host=host)
        assert resp.status == 403, (host, path, resp.status)
        assert resp.getheader("access-control-allow-origin") is None


@pytest.mark.parametrize("method,path,body", OPEN_ROUTES)
def test_local_and_allowed_hosts_are_served(served, method, path, body):
    for host in (f"127.0.0.1:{served}", f"localhost:{served}", f"[::1]:{served}", "LOCALHOST",
                 "my-box.lan:8080", "other.lan"):
        assert request(served, method, path, body, host=host).status == 200, (host, path)


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_a_foreign_origin_gets_no_cors_grant(served, method, path, body):
    for origin in ("http://attacker.example", "null", f"http://localhost:{served + 1}"):
        pre = request(served, "OPTIONS", path, host=f"localhost:{served}", origin=origin,
                      extra={"Access-Control-Request-Method": method,
                             "Access-Control-Request-Headers": "content-type"})
        simple = request(served, method, path, body, host=f"localhost:{served}", origin=origin)
        for resp in (pre, simple):
            assert resp.status == 403, (origin, path, resp.status)
            assert not [h for h, _ in resp.getheaders() if h.lower().startswith("access-control")]


def test_same_origin_requests_pass(served):
    for host in (f"127.0.0.1:{served}", "my-box.lan:8080"):
        resp = request(served, "GET", "/config", host=host, origin=f"http://{host}")
        assert resp.status == 200


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_the_login_refuses_unauthenticated_requests_on_every_route(served, method, path, body):
    wrong = "Basic " + base64.b64encode(b"me:wrong").decode()
    for auth in (None, wrong, "Bearer nope", f"Token {API_KEY}", "Basic !!notbase64"):
        resp = request(served, method, path, body, auth=auth)
        assert resp.status == 401, (auth, path, resp.status)
        assert resp.getheader("www-authenticate", "").startswith("Basic")


@pytest.mark.parametrize("method,path,body", OPEN_ROUTES)
def test_the_password_or_the_api_key_logs_in(served, method, path, body):
    assert request(served, method, path, body, auth="bearer").status == 200
    # The password opens the page (a browser's Basic prompt); /v1 itself still wants the key.
    assert request(served, method, path, body, auth="basic").status == \
        (401 if path.startswith("/v1") else 200)


def test_the_page_carries_the_content_security_policy(served):
    resp = request(served, "GET", "/")
    csp = resp.getheader("content-security-policy")
    assert csp == CSP
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["img-src"] == "'self' data: blob:"
    assert directives["connect-src"] == "'self'"
    assert directives["frame-src"] == "'none'" and directives["object-src"] == "'none'"
    assert "http" not in csp and "*" not in csp            # no remote source anywhere
    assert resp.getheader("x-frame-options") == "DENY"
    # Refusals carry it too.
    assert request(served, "GET", "/", host="evil.example").getheader(
        "content-security-policy") == CSP


def test_a_non_loopback_bind_without_login_refuses_to_start(tmp_path, caplog):
    with caplog.at_level(logging.ERROR, logger="localpaged"):
        rc = cli.main(["--host", "0.0.0.0", "--model", "/nonexistent", "--data-dir",
                       str(tmp_path)])
    assert rc == 1
    assert "--no-login-i-know-this-is-public" in caplog.text and "refusing" in caplog.text
    assert not (tmp_path / "localpaged.lock").exists()        # refused before anything started
    with pytest.raises(ValueError, match="--password"):
        require_login_for_bind("192.168.1.5", [None, None])
    require_login_for_bind("192.168.1.5", [None, "pw"])           # a login: allowed
    require_login_for_bind("0.0.0.0", [], open_ok=True)            # the explicit flag: allowed
    require_login_for_bind("::1", [])                              # loopback: no login needed


def test_host_names_and_policy():
    assert host_name("[::1]:7860") == "::1" and host_name("::1") == "::1"
    assert host_name("LocalHost:80") == "localhost" and host_name("box.lan.") == "box.lan"
    p = GuardPolicy.for_bind("10.0.0.7", ["box.lan:99", " "])
    assert {"10.0.0.7", "box.lan", "localhost", "127.0.0.1", "::1"} == set(p.allowed_hosts)
    assert not p.host_allowed("") and not p.host_allowed("10.0.0.77")
    assert GuardPolicy.for_bind("0.0.0.0").host_allowed(socket.gethostname())
    assert not p.origin_allowed("http://localhost:1", "localhost:2")
    assert not p.origin_allowed("http://10.0.0.7:3000", "10.0.0.7:7860")   # another app, same box
    assert p.origin_allowed("http://box.lan", "127.0.0.1:2")               # an --allowed-hosts name
    assert p.origin_allowed("http://10.0.0.7:7860", "10.0.0.7:7860")
    assert not p.origin_allowed("file://", "localhost:2")


def test_login_accepts_bearer_basic_and_x_api_key():
    p = GuardPolicy.for_bind("0.0.0.0", secrets=[None, "key"])
    assert p.authorized("Bearer key") and p.authorized("bearer  key ")
    assert p.authorized("Basic " + base64.b64encode(b"user:key").decode())
    assert p.authorized(None, "key")                 # Anthropic's clients send only x-api-key
    assert not p.authorized(None, "nope") and not p.authorized("Bearer nope", "nope")
    assert not p.authorized(None) and not p.authorized("key")
    assert GuardPolicy.for_bind("127.0.0.1").authorized(None)      # no secrets: no login


def test_which_secrets_log_in():
    assert login_secrets("127.0.0.1", None, "key") == []           # loopback: /v1 alone wants it
    assert login_secrets("127.0.0.1", "pw", "key") == ["pw", "key"]
    assert login_secrets("0.0.0.0", None, "key") == ["key"]         # public: the key is the login
    assert login_secrets("0.0.0.0", None, None) == []


# ---- request bodies: the bytes read are counted, chunked or not ----------------------------------
BIG = 33 * 2**20                   # past every route's limit (32 MiB)


UPLOAD_HEAD = (b"--XX\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.txt\"\r\n"
               b"Content-Type: text/plain\r\n\r\n")
UPLOAD_TYPE = "multipart/form-data; boundary=XX"


def send_body(port: int, path: str, size: int, *, chunked: bool = True,
              content_type: str = "application/json", head: bytes = b"") -> tuple[int, bytes]:
    """POST a body of `size` bytes (`head`, then x's) to path, chunked or with Content-Length,
    over a raw socket, stopping early once the server answers; returns (status, body)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                  f"Authorization: Bearer {API_KEY}\r\nContent-Type: {content_type}\r\n"
                  f"{framing}\r\n\r\n").encode())
    piece, sent = b"x" * 2**16, 0
    try:
        part = head
        while sent < size and not select.select([sock], [], [], 0)[0]:
            part = part or piece[:size - sent]
            sock.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            sent, part = sent + len(part), b""
        if sent >= size and chunked:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass                                  # the server stopped reading: its answer is there
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    body = resp.read()
    sock.close()
    return resp.status, body


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/gradio_api/upload",
                                  "/gradio_api/queue/join", "/gradio_api/cancel"])
@pytest.mark.parametrize("chunked", [True, False])
def test_a_body_past_the_limit_gets_413_on_every_route(served, path, chunked):
    upload = dict(content_type=UPLOAD_TYPE, head=UPLOAD_HEAD) if "upload" in path else {}
    status, body = send_body(served, path, BIG, chunked=chunked, **upload)
    assert status == 413, (path, chunked, status, body[:200])
    if path.startswith("/v1/"):
        error = json.loads(body)["error"]
        assert error["code"] == "request_too_large" and str(MAX_BODY_BYTES) in error["message"]
    else:
        assert str(MAX_BODY_BYTES).encode() in body


def test_bodies_within_the_limit_are_still_served(served, tiny_llama):
    chat = json.dumps({"model": tiny_llama, "max_tokens": 2, "temperature": 0,
                       "messages": [{"role": "user", "content": "hi " * 100}]}).encode()
    status, body = send_json_chunked(served, "/v1/chat/completions", chat)
    assert status == 200, body[:300]
    assert json.loads(body)["choices"][0]["finish_reason"] == "length"
    form = UPLOAD_HEAD + b"y" * 2**20 + b"\r\n--XX--\r\n"
    status, body = send_json_chunked(served, "/gradio_api/upload", form, UPLOAD_TYPE)
    assert status == 200, body[:300]
    assert json.loads(body)[0].endswith("a.txt")


def send_json_chunked(port: int, path: str, body: bytes,
                      content_type: str = "application/json") -> tuple[int, bytes]:
    """POST `body` in chunks of 64 KiB (no Content-Length); returns (status, response body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    pieces = (body[i:i + 2**16] for i in range(0, len(body), 2**16))
    conn.request("POST", path, body=pieces, encode_chunked=True,
                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": content_type,
                          "Transfer-Encoding": "chunked"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


# ---- Gradio's file routes: the app's own files, never a URL ------------------------------------
@pytest.fixture
def recorder():
    """A local HTTP server that records every request it gets (none may come)."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):                                     # noqa: N802
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(b"\x89PNG secret")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()


def test_file_routes_refuse_urls_and_make_no_request(served, recorder, monkeypatch):
    port, seen = recorder
    # Gradio fetches a URL here itself (through safehttpx, which admits public hosts only):
    # let it take the local recorder for a public host, so a fetch would show.
    import gradio.route_utils

    async def any_host_is_public(hostname: str) -> str:
        return "127.0.0.1"
    monkeypatch.setattr(gradio.route_utils.safehttpx, "async_validate_url", any_host_is_public)
    target = f"127.0.0.1:{port}/leak.png?q=secret"
    for route in ("/gradio_api/file=", "/gradio_api/file/", "/file=", "/file/",
                  "/gradio_api/proxy=", "//gradio_api/file="):
        for url in (f"http://{target}", f"https://{target}", f"//{target}", f"HTTP://{target}"):
            resp = request(served, "GET", route + url)
            assert resp.status == 403, (route, url, resp.status)
    resp = request(served, "GET", f"/gradio_api/file%3Dhttp://{target}")
    assert resp.status == 403
    assert seen == []


def test_file_routes_serve_only_the_apps_own_files(served, tmp_path):
    secret = tmp_path / "secret.txt"                  # readable, but not the app's
    secret.write_text("not for the browser")
    for path in (str(secret), "/etc/passwd", "etc/passwd"):
        for route in ("/gradio_api/file=", "/gradio_api/file/"):
            assert request(served, "GET", route + path).status == 403, (route, path)
    form = UPLOAD_HEAD + b"mine" + b"\r\n--XX--\r\n"
    status, body = send_json_chunked(served, "/gradio_api/upload", form, UPLOAD_TYPE)
    assert status == 200
    uploaded = json.loads(body)[0]                    # inside Gradio's own upload folder
    conn = http.client.HTTPConnection("127.0.0.1", served, timeout=30)
    conn.request("GET", "/gradio_api/file=" + uploaded,
                 headers={"Authorization": f"Bearer {API_KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b"mine"
    conn.close()
    escape = uploaded.rsplit("/", 1)[0] + "/../../.." + str(secret)
    assert request(served, "GET", "/gradio_api/file=" + escape).status == 403
