"""The `/api` answer shapes the jobs routes share."""
from __future__ import annotations

import json

from django.http import HttpRequest, JsonResponse


def fail(message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"ok": False, "error": message}, status=status)


def json_body(request: HttpRequest) -> dict | JsonResponse:
    """The request's JSON object, or the 400 that says why not."""
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return fail("invalid JSON body")
    return body if isinstance(body, dict) else fail("invalid JSON body: expected an object")
