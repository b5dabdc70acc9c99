"""The JSON 404 for every path no route answers, in its surface's shape."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from core.http import error_object


def not_found(request: HttpRequest, exception=None) -> JsonResponse:
    return JsonResponse(error_object(request.path, 404, "not found", "not_found"), status=404)
