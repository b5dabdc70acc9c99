"""The `/api` answer shape every dashboard route shares: `{"ok": false,
"error": message}` with its status. Routes raise `ApiError`; the `/api`
exception handler renders it (and `fail` builds the same answer directly).

The one module of `core` that uses Django (its response type); the engine
never imports it. No imports of the project's apps."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from core import jsonbody, limits


class ApiError(Exception):
    """A refusal on `/api`: its message and HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


def fail(message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"ok": False, "error": message}, status=status)


def json_body(request: HttpRequest) -> dict | JsonResponse:
    """The request's JSON object, or the 400 that says why not."""
    try:
        return jsonbody.load_object(request.body or b"{}", limits.current().max_json_depth)
    except jsonbody.JsonRefused as exc:
        return fail(str(exc))
