"""The OpenAI-compatible HTTP API, served beside the Gradio UI on one FastAPI app.

    from localpaged.api import create_api, install_error_handlers
    app = FastAPI()
    app.include_router(create_api(engine, "my-model", api_key=None))
    install_error_handlers(app)
    # then: gr.mount_gradio_app(app, demo, path="/")

`localpaged.api.server.build_app` does exactly this. With a `ServedModel(engine, "my-model")` in
place of the engine and name, `served.swap(engine2, "other")` switches the model while serving.
`app.state.metrics.record_request(out.metrics)` adds a request run outside the API (the UI's)
to the /metrics histograms of that app.

The names below are imported on first use (PEP 562): `localpaged.api.guard` and `.loading`,
which serve the start-up page, come without the engine behind `routes`.
"""

from __future__ import annotations

from localpaged.core.lazy import lazy_exports

_EXPORTS = {
    "APIError": "localpaged.api.errors",
    "install_error_handlers": "localpaged.api.errors",
    "MetricsRecorder": "localpaged.api.metrics",
    "create_api": "localpaged.api.routes",
    "check_bind_safety": "localpaged.api.security",
    "resolve_api_key": "localpaged.api.security",
    "ServedModel": "localpaged.api.served_model",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
