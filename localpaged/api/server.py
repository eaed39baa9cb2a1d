"""The HTTP server: one FastAPI app carrying the OpenAI-compatible API (and, mounted on it by the
UI, Gradio at "/"), served by uvicorn.

    app = build_app(engine, "SmolLM2-135M-Instruct", api_key=resolve_api_key(args.api_key))
    app = gr.mount_gradio_app(app, demo, path="/")      # after the API routes
    serve(app, host="127.0.0.1", port=8000)

`app.state.served` (a ServedModel) is what the API serves; `swap` it to switch models.

`guard_app(app, GuardPolicy.for_bind(host, ...))` puts the Host/Origin checks, the login and the
security headers in front of every route (localpaged.api.guard).

`python -m localpaged.api.server --model PATH` serves the API alone.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

import uvicorn
from fastapi import FastAPI

from localpaged.api import (
    MetricsRecorder,
    ServedModel,
    check_bind_safety,
    create_api,
    install_error_handlers,
    resolve_api_key,
)
from localpaged.api.anthropic import create_messages_api
from localpaged.api.body_limit import limit_bodies
from localpaged.api.guard import GuardPolicy, guard_app
from localpaged.api.images import ImagePolicy, add_image_options, policy_from_args
from localpaged.api.security import (
    OPEN_FLAG,
    login_secrets,
    require_login_for_bind,
    resolve_password,
)
from localpaged.api.served_model import as_served
from localpaged.engine.async_engine import AsyncEngine

logger = logging.getLogger(__name__)


def build_app(engine: AsyncEngine | ServedModel, model_name: str | None = None,
              api_key: str | None = None, images: ImagePolicy | None = None) -> FastAPI:
    """A FastAPI app with the API routes and OpenAI-shaped error handlers (mount Gradio after);
    `engine` served as `model_name`, or a ServedModel (no name then); `images`: where chat
    requests' images may come from (api/images.py)."""
    app = FastAPI(title="localpaged", summary="OpenAI-compatible API over a PagedAttention engine")
    served = as_served(engine, model_name)
    metrics = MetricsRecorder()                 # this app's own registry behind /metrics
    app.include_router(create_api(served, api_key=api_key, recorder=metrics, images=images))
    app.include_router(create_messages_api(served, api_key, metrics, images))   # /v1/messages
    install_error_handlers(app)
    limit_bodies(app)                           # counts the bytes read, chunked or not
    app.state.metrics = metrics
    app.state.served = served
    app.state.api_key = api_key
    return app


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000,
                log_level: str = "info") -> uvicorn.Server:
    """A uvicorn server for app, not yet started (`server.run()`, or `start_in_thread`)."""
    check_bind_safety(host, getattr(app.state, "api_key", None))
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=5)
    return uvicorn.Server(config)


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve app with uvicorn until interrupted (warns when exposed without an API key)."""
    make_server(app, host, port, log_level).run()


def start_in_thread(server: uvicorn.Server, timeout: float = 30.0) -> threading.Thread:
    """Run server in a daemon thread and wait until it accepts connections (for tests)."""
    thread = threading.Thread(target=server.run, name="localpaged-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the HTTP server did not start")
        time.sleep(0.02)
    return thread


def main(argv: list[str] | None = None) -> None:
    from localpaged.engine.llm import LLM
    from localpaged.runner.model_source import DEFAULT_MODEL

    parser = argparse.ArgumentParser(description="Serve the OpenAI-compatible API alone.")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None, help="or $LOCALPAGED_API_KEY")
    parser.add_argument("--password", default=None, help="login, or $LOCALPAGED_PASSWORD")
    parser.add_argument("--allowed-hosts", default="", help="extra Host names, comma-separated")
    parser.add_argument(OPEN_FLAG, dest="open_public", action="store_true",
                        help="serve a non-loopback address WITHOUT a login")
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    add_image_options(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    api_key = resolve_api_key(args.api_key)
    policy = GuardPolicy.for_bind(args.host, args.allowed_hosts.split(","),
                                  login_secrets(args.host, resolve_password(args.password), api_key))
    try:
        require_login_for_bind(args.host, list(policy.secrets), args.open_public)
    except ValueError as exc:
        parser.error(str(exc))
    llm = LLM(args.model, num_kv_blocks=args.num_kv_blocks, max_num_seqs=args.max_num_seqs)
    engine = AsyncEngine(llm.engine)
    app = guard_app(build_app(engine, args.served_model_name or args.model, api_key,
                              policy_from_args(args)), policy)
    try:
        serve(app, args.host, args.port)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
