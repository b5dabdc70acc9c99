"""The JSON 404 for every path no route answers, in its surface's shape."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from core import surfaces


def not_found(request: HttpRequest, exception=None) -> JsonResponse:
    return surfaces.of(request).response(404, "not found", "not_found")
