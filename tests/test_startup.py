"""The app's start-up (localpaged/api/loading.py, localpaged/cli.py): the port answers at once
with a loading page, the API with a 503 error object, /startup/status with the progress; once
the real app is handed over, its lifespan runs and every request reaches it.

The gate is driven in-process through Starlette's TestClient (it runs the ASGI lifespan); the
end-to-end test starts `python app.py` on a tiny model and watches the same port move from the
loading page to the chat page.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from localpaged.api.loading import STATUS_PATH, LoadingGate, LogTap, StartupProgress
from localpaged.ui.startup.view import LOADING_PAGE

REPO = Path(__file__).resolve().parents[1]


def _real_app(events: list) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        events.append("started")
        yield
        events.append("stopped")

    app = FastAPI(lifespan=lifespan)
    app.get("/")(lambda: {"page": "chat"})
    app.get("/v1/models")(lambda: {"data": [{"id": "m"}]})
    return app


def test_the_gate_answers_while_loading_then_hands_over():
    progress = StartupProgress("some/model")
    gate = LoadingGate(progress, LOADING_PAGE)
    events: list = []
    with TestClient(gate) as client:
        page = client.get("/")
        assert page.status_code == 503 and 'id="lp-loading"' in page.text
        assert page.headers["retry-after"] and page.headers["cache-control"] == "no-store"
        api = client.get("/v1/models")
        assert api.status_code == 503 and api.headers["retry-after"]
        error = api.json()["error"]
        assert error["code"] == "model_loading" and error["type"] == "service_unavailable"
        assert client.post("/v1/chat/completions", json={}).status_code == 503
        assert client.get("/metrics").json()["error"]["code"] == "model_loading"

        progress.report("loading", "reading tensors (5/272) · 42%")
        status = client.get(STATUS_PATH).json()
        assert status["ready"] is False and status["model"] == "some/model"
        assert status["phase"] == "loading" and status["percent"] == 42.0
        assert [s["text"] for s in status["steps"]] == ["loading: reading tensors (5/272) · 42%"]
        progress.report("loading", "reading tensors (9/272) · 61%")       # same phase: no step
        assert len(client.get(STATUS_PATH).json()["steps"]) == 1

        gate.open(_real_app(events))
        assert events == ["started"]                      # the real app's lifespan ran first
        progress.finish()
        assert client.get("/").json() == {"page": "chat"}
        assert client.get("/v1/models").status_code == 200
        assert client.get(STATUS_PATH).json()["ready"] is True
    assert events == ["started", "stopped"]               # and ended with the server


def test_a_failed_start_says_so():
    progress = StartupProgress("bad/model")
    gate = LoadingGate(progress, LOADING_PAGE)
    with TestClient(gate) as client:
        progress.finish("ModelNotFoundError: no such model")
        status = client.get(STATUS_PATH).json()
        assert status["ready"] is False and status["phase"] == "failed"
        assert "no such model" in status["error"]
        assert "failed to load" in client.get("/v1/models").json()["error"]["message"]


def test_log_lines_become_steps_while_tapped():
    progress = StartupProgress("m")
    logger = logging.getLogger("localpaged.kernels.cpu_extension")
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        with LogTap(progress):
            logger.info("CPU extension ready (%.1f s)", 2.5)
            logging.getLogger("localpaged").info("start-up: loading x")    # the CLI's own echo
            logger.debug("not a step")
        logger.info("after the start")
    finally:
        logger.setLevel(old)
    assert [s[1] for s in progress.steps] == ["CPU extension ready (2.5 s)"]


def test_the_loading_page_puts_server_text_in_as_text():
    # Model names, details and log lines reach the page only through textContent.
    assert "innerHTML" not in LOADING_PAGE and "insertAdjacentHTML" not in LOADING_PAGE
    assert "textContent" in LOADING_PAGE and STATUS_PATH in LOADING_PAGE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


@pytest.mark.slow
def test_python_app_py_serves_the_loading_page_then_the_chat(tiny_llama, tmp_path):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    log = tmp_path / "app.log"
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--model", tiny_llama,
                             "--data-dir", str(tmp_path / "data"), "--port", str(port),
                             "--num-kv-blocks", "64"], cwd=REPO, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        seen: dict[str, tuple] = {}
        while time.monotonic() - started < 240:
            assert proc.poll() is None, log.read_text()[-3000:]
            code, body = _get(base + "/")
            if code == 503:
                seen.setdefault("loading", (code, body))
                seen.setdefault("api", _get(base + "/v1/models"))
                seen.setdefault("status", _get(base + STATUS_PATH))
            elif code == 200:
                seen["chat"] = (code, body)
                break
            time.sleep(0.05)
        assert "chat" in seen, log.read_text()[-3000:]
        assert "loading" in seen, "the port answered only once the model was loaded"
        assert b'id="lp-loading"' in seen["loading"][1]
        code, body = seen["api"]
        assert code == 503 and json.loads(body)["error"]["code"] == "model_loading"
        assert json.loads(seen["status"][1])["ready"] is False
        assert b"gradio" in seen["chat"][1].lower()            # the chat page itself now
        code, body = _get(base + "/v1/models")
        assert code == 200 and json.loads(body)["data"]
        assert json.loads(_get(base + STATUS_PATH)[1])["ready"] is True
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0, log.read_text()[-3000:]      # SIGTERM: a clean shut-down
    # the store was closed (its last connection takes the write-ahead log with it)
    assert not (tmp_path / "data" / "conversations.db-wal").exists()


def test_the_repository_root_on_sys_path_shadows_no_package():
    """Run from the repository's root (`python app.py`, `python -m pytest`), the root is on
    sys.path: its only package is localpaged, so no folder there takes the place of an installed
    package (a kernels/ folder once shadowed PyPI's `kernels`, which transformers imports)."""
    packages = sorted(p.name for p in REPO.iterdir() if (p / "__init__.py").exists())
    assert packages == ["localpaged"]
    code = ("import importlib.util, json, transformers.activations\n"
            "spec = importlib.util.find_spec('kernels')\n"
            "print(json.dumps(spec and spec.origin))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    origin = json.loads(out.stdout.splitlines()[-1])
    assert origin is None or not origin.startswith(str(REPO) + os.sep + "kernels"), origin


def test_a_model_that_cannot_load_stops_the_app(tmp_path):
    rc = subprocess.run([sys.executable, str(REPO / "app.py"), "--model", str(tmp_path / "none"),
                         "--data-dir", str(tmp_path / "data"), "--port", str(_free_port())],
                        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                        capture_output=True, text=True, timeout=240)
    assert rc.returncode == 1, rc.stderr[-2000:]
    assert "cannot start" in rc.stderr
    from localpaged.ui.store.instance_lock import InstanceLock
    InstanceLock.acquire(tmp_path / "data", "http://127.0.0.1:1/").release()  # it was released
