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
import logging
import socket

import pytest

from localpaged import cli
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


def test_which_secrets_log_in():
    assert login_secrets("127.0.0.1", None, "key") == []           # loopback: /v1 alone wants it
    assert login_secrets("127.0.0.1", "pw", "key") == ["pw", "key"]
    assert login_secrets("0.0.0.0", None, "key") == ["key"]         # public: the key is the login
    assert login_secrets("0.0.0.0", None, None) == []
