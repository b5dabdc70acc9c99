"""Error answers shaped for the route they answer, for the layers that run
before a route's own handler does (connection guards, the ASGI wrapper):
OpenAI's shape on `/v1`, Anthropic's on `/v1/messages`, `{"ok": false}` on
`/api`.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import json

ANTHROPIC_TYPES = {413: "request_too_large", 408: "timeout_error", 429: "rate_limit_error",
                   503: "overloaded_error"}


def error_body(path: str, status: int, message: str, code: str) -> bytes:
    body: dict[str, object]
    if path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "invalid_request_error"),
                                           "message": message}}
    elif path.startswith("/api/"):
        body = {"ok": False, "error": message}
    else:
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return json.dumps(body).encode()
