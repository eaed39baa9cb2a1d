"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a 4xx status.

Every failure a client can cause (bad JSON, a wrong type, a value out of range, an unknown model,
a prompt too long, a missing API key) becomes one of these, never a 500. `OpenAIRoute` turns the
errors raised while FastAPI reads the body, and our own `APIError`s, into responses inside the
route itself, so the router behaves the same in whatever app it is mounted;
`install_error_handlers` gives the app's own 404/405/422 answers the same shape.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 2**20          # a request body, on any route (body_limit.py)

# Union members and other pydantic loc entries that are not field names.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "is-instance"}


class APIError(Exception):
    """An error the client can act on, answered as an OpenAI error object."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        message = _printable(message)
        super().__init__(message)
        self.message, self.status, self.type = message, status, type
        self.param, self.code = param, code

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status,
                            headers={"WWW-Authenticate": "Bearer"} if self.status == 401 else None)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def _printable(text: str) -> str:
    """Text that encodes to UTF-8 (lone surrogates from a client's JSON escaped)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def model_not_found(model: str, served: str) -> APIError:
    return APIError(f"The model '{model}' does not exist; this server serves '{served}'.",
                    404, "invalid_request_error", "model", "model_not_found")


def _param(loc: tuple) -> str | None:
    """('body', 'messages', 0, 'content', 'str') -> 'messages[0].content'."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier() and part not in _TYPE_TAGS:
            out += f".{part}" if out else part
        # other entries name a member of a union ('list[str]', ...): skipped
    return out or None


def from_validation_errors(errors: list[dict[str, Any]]) -> APIError:
    """The first pydantic/FastAPI validation error, as an OpenAI invalid_request_error."""
    if not errors:
        return APIError("Invalid request.")
    err = max(errors, key=lambda e: len(e.get("loc", ())))    # the most specific
    if err.get("type") == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        return APIError(f"We could not parse the JSON body of your request ({detail}). "
                        "The body must be a JSON object.", code="invalid_json")
    param = _param(tuple(err.get("loc", ())))
    if param is None:
        return APIError("The request body must be a JSON object "
                        f"(with Content-Type: application/json); {err.get('msg', '')}.",
                        code="invalid_body")
    if err.get("type") == "missing":
        return APIError(f"Missing required parameter: '{param}'.", param=param,
                        code="missing_required_parameter")
    if err.get("type") == "extra_forbidden":
        return APIError(f"Unrecognized request argument supplied: '{param}'.", param=param,
                        code="unknown_parameter")
    value = err.get("input")
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return APIError(f"Invalid value for '{param}': {err.get('msg', 'invalid')} (got {shown}).",
                    param=param, code="invalid_value")


def from_value_error(exc: ValueError, prompt_param: str) -> APIError:
    """A ValueError from SamplingParams or the engine's prompt checks."""
    msg = str(exc)
    if msg.startswith("SamplingParams."):
        field = msg[len("SamplingParams."):].split(" ", 1)[0]
        return APIError(f"Invalid value for '{field}': {msg}", param=field, code="invalid_value")
    if msg.startswith("prompt is") and "token" in msg and "empty" not in msg:
        return APIError(msg, param=prompt_param, code="context_length_exceeded")
    return APIError(msg, param=prompt_param, code="invalid_value")


def error_response(exc: Exception) -> JSONResponse:
    """Any exception met while handling a request, as an OpenAI error response."""
    if isinstance(exc, APIError):
        return exc.response()
    if isinstance(exc, RequestValidationError):
        return from_validation_errors(list(exc.errors())).response()
    if isinstance(exc, ValidationError):
        return from_validation_errors(exc.errors()).response()
    if isinstance(exc, StarletteHTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        return APIError(str(exc.detail), exc.status_code, kind,
                        code=code.get(exc.status_code)).response()
    logger.exception("unexpected error while serving a request")
    return APIError(f"Internal server error: {type(exc).__name__}", 500, "server_error").response()


def check_auth(request: Request, api_key: str | None) -> None:
    """Require `Authorization: Bearer <api_key>` when a key is set (401 otherwise)."""
    if not api_key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise APIError("You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                       401, code="invalid_api_key")
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError("Incorrect API key provided.", 401, code="invalid_api_key")


def check_body_size(request: Request) -> None:
    """Refuse a body announced as longer than MAX_BODY_BYTES before reading it: this router's
    own check wherever it is mounted. The bytes actually read are counted by body_limit.py's
    layer, which build_app and guard_app put in front of every route."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise APIError(f"The request body is {int(length)} bytes; at most {MAX_BODY_BYTES} are "
                       "accepted.", 413, code="request_too_large")


def route_class(api_key: str | None) -> type[APIRoute]:
    """An APIRoute that checks the API key first and answers every error in OpenAI's shape."""

    class OpenAIRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                try:
                    check_auth(request, api_key)
                    check_body_size(request)
                    return await handler(request)
                except Exception as exc:  # noqa: BLE001 - unexpected ones: a logged 500
                    return error_response(exc)

            return guarded

    return OpenAIRoute


def install_error_handlers(app: FastAPI) -> None:
    """The app's own errors (unknown path, wrong method, validation) in OpenAI's shape, as 4xx."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    app.add_exception_handler(RequestValidationError, handle)
    app.add_exception_handler(StarletteHTTPException, handle)
    app.add_exception_handler(APIError, handle)
