"""The JSON 404 for every path no route answers."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse


def not_found(request: HttpRequest, exception=None) -> JsonResponse:
    return JsonResponse({"error": {"message": "not found"}}, status=404)
