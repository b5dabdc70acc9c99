"""The `/api` answer shapes the jobs routes share."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from core import jsonbody, limits


def fail(message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"ok": False, "error": message}, status=status)


def json_body(request: HttpRequest) -> dict | JsonResponse:
    """The request's JSON object, or the 400 that says why not."""
    try:
        return jsonbody.load_object(request.body or b"{}", limits.current().max_json_depth)
    except jsonbody.JsonRefused as exc:
        return fail(str(exc))
