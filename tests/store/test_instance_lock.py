"""One app per data directory, with real processes: a second start is refused with the running
one's URL, the store's 'streaming' replies are left alone while their writer lives, and after a
kill -9 of the holder a new start takes the lock over (and only then marks them interrupted).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from localpaged.ui.store.instance_lock import (LOCK_FILENAME, InstanceLock, InstanceRunning,
                                               read_owner)

REPO = Path(__file__).resolve().parents[2]
# Holds the lock in a child process (the module alone: no torch import) until stdin closes.
HOLDER = ("import importlib.util, sys\n"
          "spec = importlib.util.spec_from_file_location('il', sys.argv[1])\n"
          "il = sys.modules['il'] = importlib.util.module_from_spec(spec)\n"
          "spec.loader.exec_module(il)\n"
          "il.InstanceLock.acquire(sys.argv[2], sys.argv[3]); print('held', flush=True)\n"
          "sys.stdin.read()\n")


def _hold(data_dir: Path, url: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(REPO / "localpaged" / "ui" / "store" /
                             "instance_lock.py"), str(data_dir), url],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"          # blocks until the lock is taken
    return proc


def _kill9(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_a_second_holder_is_refused_with_the_url_and_a_dead_ones_lock_is_taken_over(tmp_path):
    first = _hold(tmp_path, "http://127.0.0.1:7861/")
    try:
        with pytest.raises(InstanceRunning, match=r"already running .* at http://127\.0\.0\.1:7861/") \
                as info:
            InstanceLock.acquire(tmp_path, "http://127.0.0.1:7862/")
        assert info.value.pid == first.pid and info.value.url == "http://127.0.0.1:7861/"
        assert read_owner(tmp_path / LOCK_FILENAME) == (first.pid, "http://127.0.0.1:7861/")
    finally:
        _kill9(first)
    # The lock file is still there (stale), naming a dead pid: it is taken over, not obeyed.
    assert (tmp_path / LOCK_FILENAME).exists()
    lock = InstanceLock.acquire(tmp_path, "http://127.0.0.1:7862/")
    try:
        assert read_owner(tmp_path / LOCK_FILENAME) == (os.getpid(), "http://127.0.0.1:7862/")
        with pytest.raises(InstanceRunning):                 # and now it is ours
            InstanceLock.acquire(tmp_path, "http://127.0.0.1:7863/")
    finally:
        lock.release()
    InstanceLock.acquire(tmp_path, "http://127.0.0.1:7864/").release()   # released: free again


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_app(model: str, data_dir: Path, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(REPO / "app.py"), "--model", model, "--data-dir",
                             str(data_dir), "--port", str(port), "--num-kv-blocks", "64"],
                            cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait_up(proc: subprocess.Popen, url: str, log: Path, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the app exited:\n{log.read_text()[-3000:]}"
        try:
            urllib.request.urlopen(url + "config", timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"the app did not come up:\n{log.read_text()[-3000:]}")


@pytest.mark.slow
def test_a_second_app_on_the_same_data_dir_exits_with_the_first_ones_url(tiny_llama, tmp_path):
    from localpaged.ui.store import DB_FILENAME, Store
    data = tmp_path / "data"
    port1, port2 = _free_port(), _free_port()
    url1 = f"http://127.0.0.1:{port1}/"
    first = _start_app(tiny_llama, data, port1, tmp_path / "first.log")
    third = None
    try:
        _wait_up(first, url1, tmp_path / "first.log")
        # A reply the first app is writing (its row says 'streaming' until it completes).
        with Store(data / DB_FILENAME) as store:
            conv = store.create_conversation("live")
            user = store.add_message(conv.id, None, "user", "hello")
            live = store.add_message(conv.id, user.id, "assistant", "partial", status="streaming")
        second = _start_app(tiny_llama, data, port2, tmp_path / "second.log")
        assert second.wait(120) != 0
        out = (tmp_path / "second.log").read_text()
        assert f"already running on {data} at {url1}" in out, out[-2000:]
        with Store(data / DB_FILENAME) as store:              # the live reply was not touched
            assert store.get_message(live.id).status == "streaming"
        urllib.request.urlopen(url1 + "config", timeout=10)   # and the first app still serves
        _kill9(first)
        third = _start_app(tiny_llama, data, port2, tmp_path / "third.log")
        _wait_up(third, f"http://127.0.0.1:{port2}/", tmp_path / "third.log")
        with Store(data / DB_FILENAME) as store:              # its writer is dead: now interrupted
            assert store.get_message(live.id).status == "interrupted"
        assert read_owner(data / LOCK_FILENAME) == (third.pid, f"http://127.0.0.1:{port2}/")
    finally:
        for proc in (first, third):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(30)
