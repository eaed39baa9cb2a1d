"""Start-up as a user meets it: `python app.py` on a fresh data dir, timed from the process's
start to the port's first answer (the loading page), and to the chat page (ready).

    python bench/startup.py [--model NAME] [--runs 2]

Per run: seconds to the first HTTP answer on "/" (503, the loading page), whether /v1/models
answered 503 with a JSON error meanwhile, seconds to "/" answering 200 (the chat page; one
render of it included), and the phases' times from /startup/status. The machine's load average
is recorded beside them (the figures are waits on a shared machine as much as work). The CPU
extension is whatever the cache holds: a first build runs in the background and never delays
ready (kernels/cpu_extension.py). Writes bench/results/startup-<time>.json, prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 120) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


def one_run(model: str | None) -> dict:
    port, data = _free_port(), tempfile.mkdtemp(prefix="startup-bench-")
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, os.path.join(REPO, "app.py"), "--data-dir", data, "--port", str(port)]
    cmd += ["--model", model] if model else []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    out: dict = {"load_average_at_start": os.getloadavg()[0]}
    try:
        while time.monotonic() - started < 900 and proc.poll() is None:
            code, body = _get(base + "/")
            now = time.monotonic() - started
            if code is not None and "first_answer_s" not in out:
                out["first_answer_s"] = round(now, 2)
                out["first_answer_is_loading_page"] = code == 503 and b"lp-loading" in body
                api_code, api_body = _get(base + "/v1/models")
                out["api_while_loading"] = api_code
                out["api_error_code"] = (json.loads(api_body)["error"]["code"]
                                         if api_code == 503 else None)
            if code == 200:
                out["ready_s"] = round(now, 2)
                break
            time.sleep(0.05)
        status = json.loads(_get(base + "/startup/status")[1] or b"{}")
        out["steps"] = [(s["at_s"], s["text"]) for s in status.get("steps", [])
                        if not s["text"].startswith("loading: ") or "%" not in s["text"]]
        out["load_average_at_end"] = os.getloadavg()[0]
    finally:
        proc.terminate()
        proc.wait(60)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the app's (the bundled SmolLM2)")
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    runs = [one_run(args.model) for _ in range(args.runs)]
    print(f"{'run':>3} {'first screen s':>15} {'ready s':>8} {'API while loading':>18} "
          f"{'load avg':>9}")
    for k, r in enumerate(runs, 1):
        print(f"{k:>3} {r.get('first_answer_s', '-'):>15} {r.get('ready_s', '-'):>8} "
              f"{r.get('api_while_loading', '-')!s:>18} {r['load_average_at_start']:>9.1f}")
    for at, text in runs[-1].get("steps", []):
        print(f"    {at:7.1f} s  {text}")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", f"startup-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"model": args.model or "default", "cpus": os.cpu_count(), "runs": runs}, f,
                  indent=1)
    print(path)


if __name__ == "__main__":
    main()
