"""Routes outside the ninja APIs: health, stats, metrics, the prompt-cache
admin routes and the JSON 404."""
from __future__ import annotations

import asyncio

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from core import jsonbody, limits
from inference.engine.errors import EngineError
from inference.runtime import runtime
from inference.telemetry import render_metrics, stats_body

FLUSH_TIMEOUT_S = 120.0


def health(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def stats(request: HttpRequest) -> JsonResponse:
    body = stats_body()
    body["access"] = {"api_key_required": bool(runtime.api_keys), "cors_origins": sorted(runtime.cors_origins),
                      "insecure_no_auth": runtime.insecure_no_auth}
    if runtime.insecure_no_auth:
        from inference.serving_access import INSECURE_WARNING

        body["warning"] = INSECURE_WARNING
    return JsonResponse(body)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    body, content_type = render_metrics()
    return HttpResponse(body, content_type=content_type)


def _json_object(request: HttpRequest) -> dict | JsonResponse:
    try:
        return jsonbody.load_object(request.body or b"{}", limits.current().max_json_depth)
    except jsonbody.JsonRefused as exc:
        return JsonResponse({"error": {"message": str(exc), "type": "invalid_request_error", "param": None,
                                       "code": None}}, status=400)


@csrf_exempt
@require_POST
def cache_session_close(request: HttpRequest) -> JsonResponse:
    body = _json_object(request)
    if isinstance(body, JsonResponse):
        return body
    session = body.get("session_id")
    if not isinstance(session, str) or not session:
        return JsonResponse({"closed": False})
    if runtime.engine is not None:
        runtime.engine.close_session(session)
    return JsonResponse({"closed": True})


@csrf_exempt
@require_POST
async def cache_flush(request: HttpRequest) -> JsonResponse:
    engine = runtime.engine
    if engine is None or engine.loaded is None:
        return JsonResponse({"error": {"message": "no model is loaded in this process",
                                       "type": "engine_unavailable", "param": None, "code": "no_model_loaded"}},
                            status=503)
    try:
        durable, body = await asyncio.to_thread(engine.flush_cache, FLUSH_TIMEOUT_S)
    except EngineError as exc:  # the engine stopped or did not answer in time
        return JsonResponse({"error": {"message": str(exc), "type": exc.type, "param": None, "code": exc.code}},
                            status=exc.status if exc.status >= 500 else 503)
    return JsonResponse(body, status=200 if durable else 503)


def not_found(request: HttpRequest, exception=None) -> JsonResponse:
    return JsonResponse({"error": {"message": "not found"}}, status=404)


def api_index(request: HttpRequest) -> JsonResponse:
    from inference.api import api_index as index

    return JsonResponse(index())
