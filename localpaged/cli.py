"""`localpaged` (and `python app.py`): load the model, open the conversation store and serve
the chat UI (Gradio, at "/") beside the OpenAI-compatible API (/v1) on one uvicorn server,
at http://127.0.0.1:7860 unless told otherwise. Never public by default.

With `--backend URL` the chat talks to a remote OpenAI-compatible server instead of a local
engine (no /v1 API of our own then; `--api-key` is that server's key). Without it, `--api-key`
(or $LOCALPAGED_API_KEY) protects our /v1 API.

Security (localpaged.api.guard): every route refuses foreign Host headers and foreign origins;
a non-loopback --host needs a login (--password, or --api-key) unless
--no-login-i-know-this-is-public is given. One app per data dir
(localpaged.ui.store.instance_lock): a second start exits with the running one's URL.

Start-up: the port answers at once. `main` takes the data dir's lock and opens the store, then
serves localpaged.api.loading's gate (behind the same guard) while a thread loads the model and
builds the chat page; until then a browser gets the loading page (progress, then a reload into
the chat) and the API a 503 JSON error. Torch, transformers and Gradio are imported by that
thread, not before the port answers. A failed load stops the server (exit status 1).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("localpaged")


# The app drafts from the conversation by default: output is token for token the same, a
# regenerate or a code edit (replies that copy from the conversation) decodes faster, and free
# text, where drafts find nothing, costs little (docs/benchmarks.md, 'Speculative decoding').
APP_SPECULATION = "ngram"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from localpaged.core import config
    p = argparse.ArgumentParser(prog="localpaged", description="The localpaged chat app: a "
                                "local LLM chat UI on a PagedAttention engine, with an "
                                "OpenAI-compatible API at /v1.")
    p.add_argument("--model", default=None,
                   help="Hub id, local directory or .gguf file (default "
                        "HuggingFaceTB/SmolLM2-135M-Instruct, bundled; with --backend: the "
                        "remote server's first model)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; 0.0.0.0 makes it public)")
    p.add_argument("--port", type=int, default=7860, help="default 7860")
    p.add_argument("--data-dir", default=None,
                   help="where conversations are kept (default $LOCALPAGED_DATA_DIR or the "
                        "per-user data dir)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV-cache blocks (default: sized from free memory)")
    p.add_argument("--max-model-len", type=int, default=None, metavar="TOKENS",
                   help="cap the context (prompt plus reply) at TOKENS, to save memory "
                        "(default: the model's own context length)")
    p.add_argument("--dtype", default=config.default("dtype"), choices=config.DTYPES,
                   help="weights and KV cache (default auto: float32 on CPU)")
    p.add_argument("--kv-cache-dtype", default=config.default("kv_cache_dtype"),
                   choices=config.KV_CACHE_DTYPES,
                   help="KV cache (default auto: the model's dtype); bfloat16/float16 halve "
                        "the memory a token of context costs, int8 (a scale per token and "
                        "head) nearly quarters it")
    p.add_argument("--kv-disk-gb", type=float, default=config.default("kv_disk_gb"), metavar="GB",
                   help="keep full KV blocks of finished turns on disk under the data dir, at "
                        "most GB (least recently used dropped first), so a conversation reopened "
                        "after a restart is not prefilled again; 0: off")
    p.add_argument("--quantization", default=config.default("quantization"),
                   choices=config.QUANTIZATION,
                   help="weight-only quantization (default auto: a GGUF keeps its bit width, "
                        "Q4 as int4 and Q8 as int8; safetensors load as is)")
    p.add_argument("--attention-backend", default=config.default("attention_backend"),
                   choices=config.ATTENTION_BACKENDS,
                   help="paged-attention kernels (default auto: triton on CUDA, checked at "
                        "start-up with a fallback to torch; on CPU cpu, the torch reference "
                        "with decode attention in C++)")
    p.add_argument("--speculation", default=APP_SPECULATION, choices=config.SPECULATION,
                   help="speculative decoding: ngram drafts tokens from the conversation itself "
                        "(a regenerate from its earlier replies) and verifies them in one step; "
                        "draft also asks --draft-model where the conversation holds nothing to "
                        "copy; it pauses itself where it does not pay; off: one token a step "
                        f"(default {APP_SPECULATION}; the Python engine's default is off)")
    p.add_argument("--draft-model", default=None, metavar="MODEL",
                   help="a small model with the same tokenizer (name or path, as --model) that "
                        "drafts tokens for --speculation draft; it keeps its own KV blocks")
    p.add_argument("--eager", action="store_true",
                   help="decode steps in plain Python: no CUDA graphs (on by default on CUDA), "
                        "no C++ layer loop for one conversation on CPU")
    p.add_argument("--backend", default=None, metavar="URL",
                   help="a remote OpenAI-compatible server (e.g. http://host:8000/v1) instead "
                        "of the local engine")
    p.add_argument("--api-key", default=None,
                   help="key of the remote --backend; else the key our /v1 API requires "
                        "(or $LOCALPAGED_API_KEY)")
    p.add_argument("--allowed-hosts", default="", metavar="NAMES",
                   help="comma-separated extra host names the page may be reached by (besides "
                        "the bound address, localhost, 127.0.0.1, [::1]); others get 403")
    p.add_argument("--password", default=None,
                   help="login for the UI and the API (browser prompt; any user name), or "
                        "$LOCALPAGED_PASSWORD; required to bind a non-loopback address unless "
                        "--api-key is set")
    p.add_argument("--no-login-i-know-this-is-public", dest="open_public", action="store_true",
                   help="serve a non-loopback address WITHOUT a login: anyone who can reach it "
                        "reads and writes your conversations")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    from localpaged.api.images import add_image_options
    add_image_options(p)
    args = p.parse_args(argv)
    if args.speculation == "draft" and not args.draft_model:
        p.error("--speculation draft needs --draft-model (a small model with the same tokenizer)")
    return args


def open_data(args: argparse.Namespace):
    """The data dir (private), its one-app lock and the store: (data dir, lock, store)."""
    from localpaged.ui.store import DB_FILENAME, Store, default_data_dir
    from localpaged.ui.store.instance_lock import InstanceLock
    from localpaged.ui.store.private import private_dir

    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    private_dir(data_dir)                 # 0700 when we create it: conversations are private
    # The lock first: only its holder may mark 'streaming' replies interrupted (no live writer).
    lock = InstanceLock.acquire(data_dir, f"http://{_display_host(args.host)}:{args.port}/")
    store = Store(data_dir / DB_FILENAME)
    store.mark_interrupted()
    return data_dir, lock, store


def build(args: argparse.Namespace, data=None, progress=None):
    """Everything but the server: (FastAPI app, controller, model manager, store). `data` is
    open_data's result (None: opened here); `progress` (a loading.StartupProgress) hears each
    phase."""
    last = [None]

    def report(phase: str, detail: str = "") -> None:
        if progress is not None:
            progress.report(phase, detail)
        # a new phase is a line of the log; its progress (e.g. tensor by tensor) only in debug
        log.log(logging.INFO if phase != last[0] else logging.DEBUG, "start-up: %s %s", phase,
                detail)
        last[0] = phase

    data_dir, lock, store = data or open_data(args)
    report("importing the engine", "torch, transformers")
    from localpaged.runner.model_source import DEFAULT_MODEL
    from localpaged.ui.models import ModelManager, local_factory
    from localpaged.ui.models.memory import ModelMemory
    memory = ModelMemory(store)           # the last model and per-model defaults (app_settings)
    if args.backend:
        factory = _remote_factory(args.backend, args.api_key)
        name = args.model
    else:
        factory = local_factory(args.num_kv_blocks, args.dtype, max_model_len=args.max_model_len,
                                quantization=args.quantization,
                                attention_backend=args.attention_backend, enforce_eager=args.eager,
                                speculation=args.speculation, draft_model=args.draft_model,
                                kv_cache_dtype=args.kv_cache_dtype, **_kv_disk(args, data_dir))
        name, options = memory.start_model(args.model, DEFAULT_MODEL, args.max_model_len)
    if progress is not None:
        progress.model = name or args.backend
    started = time.monotonic()
    log.info("loading %s …", name or f"the model served at {args.backend}")
    if args.backend:
        backend = factory(name, report)
    else:                                 # a remembered model that is gone: the default
        name, backend = memory.load_at_start(factory, name, options, report, DEFAULT_MODEL,
                                             remembered=not args.model)
    log.info("model %s ready in %.1f s", backend.model_name, time.monotonic() - started)
    stats = backend.stats()
    if stats is not None and stats.kernels:           # a local engine: what serves the weights
        log.info("weights %s, served by %s (%s)", stats.weights_format, stats.kernels,
                 stats.formats_text)
    report("building the chat page", "Gradio")
    import gradio as gr

    from localpaged.api.guard import guard_app
    from localpaged.ui.app import CSS, THEME, build_demo, ui_routes
    from localpaged.ui.controller import ChatController
    from localpaged.ui.page_head import add_early_script
    app = _api_app(args, backend)
    models = ModelManager(factory, backend=backend, served=getattr(app.state, "served", None))
    ctl = ChatController(store, lambda: models.backend, state_file=data_dir / "ui_state.json")
    models.on_swap = ctl.stop_all
    memory.presets = ctl.presets          # a model's saved sampling: the new chats' defaults
    models.memory = memory
    demo = build_demo(ctl, models)
    app.include_router(ui_routes(ctl))                 # before Gradio takes "/"
    app = gr.mount_gradio_app(app, demo, path="/", theme=THEME, css=CSS,
                              footer_links=[], server_name=args.host, server_port=args.port)
    add_early_script(app)                              # the page's first script (page_head.py)
    guard_app(app, _guard_policy(args))
    app.state.instance_lock = lock
    log.info("conversations in %s", store.path)
    return app, ctl, models, store


def _guard_policy(args: argparse.Namespace):
    """Host/origin checks and the login (the password; the API key too when /v1 is ours)."""
    from localpaged.api.guard import GuardPolicy
    from localpaged.api.security import login_secrets, resolve_api_key, resolve_password
    api_key = None if args.backend else resolve_api_key(args.api_key)    # else: the remote's key
    secrets = login_secrets(args.host, resolve_password(args.password), api_key)
    return GuardPolicy.for_bind(args.host, args.allowed_hosts.split(","), secrets)


def _remote_factory(url: str, api_key: str | None):
    def build(name: str | None, progress):
        from localpaged.chat.remote import RemoteChatBackend
        progress("connecting", url)
        return RemoteChatBackend(url, api_key=api_key, model=name or None)
    return build


def _api_app(args: argparse.Namespace, backend):
    """The FastAPI app the UI is mounted on: with our /v1 API when the engine is local."""
    from fastapi import FastAPI
    engine = getattr(backend, "engine", None)
    if args.backend or engine is None:
        return FastAPI(title="localpaged")
    try:
        from localpaged.api import resolve_api_key
        from localpaged.api.images import policy_from_args
        from localpaged.api.server import build_app
    except ImportError:                    # the API is optional for the chat UI
        log.warning("localpaged.api.server is unavailable: serving the chat UI without /v1")
        return FastAPI(title="localpaged")
    return build_app(engine, backend.model_name, resolve_api_key(args.api_key),
                     policy_from_args(args))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from localpaged.ui.store.instance_lock import InstanceRunning
    try:
        policy = _guard_policy(args)
        from localpaged.api.security import require_login_for_bind
        require_login_for_bind(args.host, list(policy.secrets), args.open_public)
        data = open_data(args)
    except InstanceRunning as exc:
        log.error("%s", exc)
        return 2
    except Exception as exc:  # noqa: BLE001 - one clear line instead of a traceback
        log.error("cannot start: %s", exc)
        log.debug("start-up failure", exc_info=True)
        return 1
    import uvicorn

    from localpaged.api.guard import GuardMiddleware
    from localpaged.api.loading import LoadingGate, StartupProgress
    from localpaged.ui.startup.view import LOADING_PAGE
    progress = StartupProgress(args.model or args.backend or "the default model")
    gate = LoadingGate(progress, LOADING_PAGE)
    server = uvicorn.Server(uvicorn.Config(GuardMiddleware(gate, policy), host=args.host,
                                           port=args.port, log_level="warning",
                                           timeout_graceful_shutdown=3))
    built: list = []                       # (app, ctl, models, store) once the thread built it
    threading.Thread(target=_load, args=(args, data, progress, gate, server, built),
                     name="start-up", daemon=True).start()
    log.info("chat UI at http://%s:%d (loading the model)", _display_host(args.host), args.port)
    restore = _exit_cleanly_on_signals()
    try:
        server.run()
    finally:
        _shut_down(data, built)
        restore()
    return 1 if progress.error else 0


def _exit_cleanly_on_signals():
    """uvicorn shuts down on SIGINT/SIGTERM and then raises the signal again for the handler it
    found; the default one would end the process before `main` saves and closes. This one makes
    it a SystemExit(0), so the shut-down runs. Returns what puts the old handlers back."""
    import signal
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum, frame):
        raise SystemExit(0)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    return lambda: [signal.signal(sig, handler) for sig, handler in old.items()]


def _load(args, data, progress, gate, server, built: list) -> None:
    """The start-up thread: once the server listens, load and build, then open the gate; a
    failure stops the server."""
    from localpaged.api.loading import LogTap
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    try:
        with LogTap(progress):
            built.append(build(args, data, progress))
            progress.report("starting the chat page")
            gate.open(built[0][0])
    except Exception as exc:  # noqa: BLE001 - one clear line instead of a traceback
        log.error("cannot start: %s", exc)
        log.debug("start-up failure", exc_info=True)
        progress.finish(f"{type(exc).__name__}: {exc}")
        server.should_exit = True
        return
    progress.finish()
    log.info("ready in %.1f s: http://%s:%d", progress.elapsed(), _display_host(args.host),
             args.port)


def _shut_down(data, built: list) -> None:
    _, lock, store = data
    if built:
        _, ctl, models, _ = built[0]
        ctl.stop_all(wait=5.0)            # stopped replies are saved before the store closes
        engine = getattr(models.backend, "engine", None)
        if engine is not None and hasattr(engine, "shutdown"):
            engine.shutdown()
    store.close()
    lock.release()


def _kv_disk(args, data_dir: Path) -> dict:
    """The disk tier's engine options: under the data dir, unless --kv-disk-gb 0."""
    if args.kv_disk_gb <= 0:
        return {}
    return {"kv_disk_dir": str(data_dir / "kv"), "kv_disk_gb": args.kv_disk_gb}


def _display_host(host: str) -> str:
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"[{host}]" if ":" in host else host          # an IPv6 address in a URL


if __name__ == "__main__":
    sys.exit(main())
