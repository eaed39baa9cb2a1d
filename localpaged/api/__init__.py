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
"""

from localpaged.api.errors import APIError, install_error_handlers
from localpaged.api.metrics import MetricsRecorder
from localpaged.api.routes import create_api
from localpaged.api.security import check_bind_safety, resolve_api_key
from localpaged.api.served import ServedModel

__all__ = ["create_api", "install_error_handlers", "MetricsRecorder",
           "APIError", "ServedModel", "check_bind_safety", "resolve_api_key"]
