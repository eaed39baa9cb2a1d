"""Errors and the API key on the Anthropic routes.

An error is `{"type": "error", "error": {"type": ..., "message": ...}}` with the status of the
OpenAI-shaped error the same failure gets on the other routes (api/errors.py decides both the
status and the message; this module only reshapes them), the error type following the status
as Anthropic's does. The key is accepted as `x-api-key` (what Anthropic's clients send) or as
`Authorization: Bearer`.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from localpaged.api.errors import APIError, check_auth
from localpaged.api.errors import route_class as openai_route_class

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def reshaped(response: Response) -> Response:
    """An OpenAI-shaped error response (api/errors.py) in Anthropic's shape, its param (where
    the message does not name it) before the message; others as they are."""
    if response.status_code < 400 or not isinstance(response, JSONResponse):
        return response
    error = json.loads(response.body).get("error")
    if not isinstance(error, dict):
        return response
    headers = {k: v for k, v in response.headers.items() if k.lower() == "www-authenticate"}
    message, param = str(error.get("message", "")), error.get("param")
    if param and str(param) not in message:          # Anthropic's shape has no param field
        message = f"{param}: {message}"
    return JSONResponse(error_body(response.status_code, message),
                        status_code=response.status_code, headers=headers or None)


def check_key(request: Request, api_key: str | None) -> None:
    """Require the key, as `x-api-key` or `Authorization: Bearer`, when one is set."""
    if not api_key:
        return
    key = request.headers.get("x-api-key")
    if key is None and "authorization" in request.headers:
        check_auth(request, api_key)
        return
    if not key or not key.strip():
        raise APIError("You didn't provide an API key. Send it in the 'x-api-key' header.", 401,
                       code="invalid_api_key")
    if not hmac.compare_digest(key.strip().encode(), api_key.encode()):
        raise APIError("Incorrect API key provided.", 401, code="invalid_api_key")


def route_class(api_key: str | None) -> type[APIRoute]:
    """The OpenAI routes' APIRoute (body limit, errors as 4xx) with the key checked first, as
    x-api-key or Bearer, and every error answered in Anthropic's shape."""

    class AnthropicRoute(openai_route_class(None)):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                try:
                    check_key(request, api_key)
                except APIError as exc:
                    return reshaped(exc.response())
                return reshaped(await handler(request))

            return guarded

    return AnthropicRoute
