"""The operational routes outside the ninja APIs: `/health`, `/stats`,
`/metrics` and the prompt-cache admin routes (`/admin/cache/*`)."""
from __future__ import annotations

import asyncio

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from core import jsonbody, limits
from inference import telemetry
from inference.engine.errors import EngineError
from inference.protocols.errors import openai_error

FLUSH_TIMEOUT_S = 120.0


def health(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def stats(request: HttpRequest) -> JsonResponse:
    return JsonResponse(telemetry.stats_body(request.runtime))


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    body, content_type = telemetry.render_metrics(request.runtime)
    return HttpResponse(body, content_type=content_type)


def _json_object(request: HttpRequest) -> dict | JsonResponse:
    try:
        return jsonbody.load_object(request.body or b"{}", limits.current().max_json_depth)
    except jsonbody.JsonRefused as exc:
        return JsonResponse(openai_error(str(exc)), status=400)


@csrf_exempt
@require_POST
def cache_session_close(request: HttpRequest) -> JsonResponse:
    body = _json_object(request)
    if isinstance(body, JsonResponse):
        return body
    session = body.get("session_id")
    if not isinstance(session, str) or not session:
        return JsonResponse({"closed": False})
    engine = request.runtime.engine
    if engine is not None:
        engine.close_session(session)
    return JsonResponse({"closed": True})


@csrf_exempt
@require_POST
async def cache_flush(request: HttpRequest) -> JsonResponse:
    engine = request.runtime.engine
    if engine is None or engine.loaded is None:
        return JsonResponse(openai_error("no model is loaded in this process", "engine_unavailable",
                                         code="no_model_loaded"), status=503)
    try:
        durable, body = await asyncio.to_thread(engine.flush_cache, FLUSH_TIMEOUT_S)
    except EngineError as exc:  # the engine stopped or did not answer in time
        return JsonResponse(openai_error(str(exc), exc.type, code=exc.code),
                            status=exc.status if exc.status >= 500 else 503)
    return JsonResponse(body, status=200 if durable else 503)
