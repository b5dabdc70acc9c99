"""Error answers shaped for the surface they answer, by path: Anthropic's on
`/v1/messages*`, `{"ok": false}` on `/api/`, OpenAI's everywhere else. Every
layer that answers an error before or outside a route's own handler (the
connection guards, the ASGI wrapper, middleware, the 404 handler) and the
`/v1` error renderer build it here, so one surface never answers in two
shapes.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import json

from core import sse

ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                   429: "rate_limit_error", 503: "overloaded_error"}

DRAINING_HEADER = "x-hearth-draining"  # on the 503 a draining server answers (another web node retries here)


def anthropic_type(status: int) -> str:
    """Anthropic's error `type` for an HTTP status."""
    return ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def openai_error(message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> dict:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_object(path: str, status: int, message: str, code: str | None = None, kind: str | None = None,
                 param: str | None = None) -> dict:
    """The error body for `path`. `kind` (OpenAI's `type`) defaults by status;
    `code` and `param` appear in OpenAI's shape only."""
    if is_anthropic(path):
        return {"type": "error", "error": {"type": anthropic_type(status), "message": message}}
    if path.startswith("/api/"):
        return {"ok": False, "error": message}
    return openai_error(message, kind or ("server_error" if status >= 500 else "invalid_request_error"), param, code)


def error_body(path: str, status: int, message: str, code: str | None = None, kind: str | None = None) -> bytes:
    """`error_object` as the bytes of a JSON body."""
    return json.dumps(error_object(path, status, message, code, kind)).encode()


def protocol(path: str) -> str:
    """The wire protocol a `/v1` path speaks: anthropic, responses or openai."""
    if is_anthropic(path):
        return "anthropic"
    return "responses" if path.startswith("/v1/responses") else "openai"


def stream_error(path: str, message: str) -> bytes:
    """The event that ends a stream of `path`'s protocol with a server error."""
    kind = protocol(path)
    if kind == "anthropic":
        return sse.frame({"type": "error", "error": {"type": "api_error", "message": message}}, "error")
    if kind == "responses":
        return sse.frame({"type": "error", "code": "server_error", "message": message, "param": None}, "error")
    return sse.frame(openai_error(message, "server_error", None, "server_error"))
