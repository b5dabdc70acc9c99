"""Routes outside the ninja APIs: health, stats and the JSON 404."""
from __future__ import annotations

import time

from django.http import HttpRequest, JsonResponse

from inference.runtime import runtime


def health(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def stats(request: HttpRequest) -> JsonResponse:
    engine = runtime.engine
    body: dict = {"model": None, "uptime_s": None, "engine": None}
    if engine is not None and engine.loaded is not None:
        s = engine.stats
        body["model"] = engine.loaded.model_id
        body["uptime_s"] = int(time.time()) - runtime.started_at
        body["engine"] = {
            "active": s.requests_active, "queued": engine.queued, "requests_total": s.requests_total,
            "prompt_tokens_total": s.prompt_tokens_total, "generated_tokens_total": s.generated_tokens_total,
            "last_decode_tokens_per_s": round(s.last_decode_tps, 2), "dtype": engine.loaded.dtype,
        }
    body["draining"] = runtime.draining
    return JsonResponse(body)


def not_found(request: HttpRequest, exception=None) -> JsonResponse:
    return JsonResponse({"error": {"message": "not found"}}, status=404)


def api_index(request: HttpRequest) -> JsonResponse:
    from inference.api import api_index as index

    return JsonResponse(index())
