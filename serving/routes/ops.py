"""The operational routes outside the ninja APIs: `/health`, `/stats`,
`/metrics`, the prompt-cache admin routes (`/admin/cache/*`) and
`/admin/transcription/unload`."""
from __future__ import annotations

import asyncio

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from core import surfaces
from inference.engine.errors import EngineError
from inference.protocols import params
from inference.protocols.errors import RequestError
from serving import telemetry
from serving.routes import errors, proxy

FLUSH_TIMEOUT_S = 120.0


def health(request: HttpRequest) -> JsonResponse:
    body: dict = {"status": "ok"}
    service = request.runtime.transcriber
    if service is not None and service.available:
        # /health answers without a key: the state, not which model (that is on /stats)
        body["transcription"] = {k: v for k, v in service.stats().items() if k != "model"}
    if request.runtime.demo_build is not None:  # the demo model training in the background
        body["demo_build"] = request.runtime.demo_build
    return JsonResponse(body)


@csrf_exempt
@require_POST
async def transcription_unload(request: HttpRequest) -> JsonResponse:
    """Page the Whisper weights out now; answers whether they were in, with the stats block."""
    service = request.runtime.transcriber
    if service is None:
        return errors.render(surfaces.of(request), 503,
                             "no Whisper model is configured (`hearth serve --whisper-model`)", "model_unavailable",
                             code="model_unavailable")
    try:
        unloaded = await asyncio.wait_for(asyncio.wrap_future(service.unload()), FLUSH_TIMEOUT_S)
    except EngineError as exc:
        return errors.engine_error(surfaces.of(request), exc)
    except TimeoutError:
        return errors.render(surfaces.of(request), 503, "the engine stayed busy; try again later", "engine_unavailable")
    return JsonResponse({"unloaded": unloaded, **service.stats()})


@require_GET
async def stats(request: HttpRequest) -> JsonResponse:
    body = telemetry.stats_body(request.runtime)
    if request.runtime.router is not None:  # with each loaded model's own
        return await proxy.stats(request, body)
    return JsonResponse(body)


@require_GET
async def metrics(request: HttpRequest) -> HttpResponse:
    body, content_type = telemetry.render_metrics(request.runtime)
    if request.runtime.router is not None:  # with each loaded model's series, labelled `model`
        return await proxy.metrics(request, body, content_type)
    return HttpResponse(body, content_type=content_type)


@csrf_exempt
@require_POST
def cache_session_close(request: HttpRequest) -> JsonResponse:
    try:
        body = params.parse_json_body(request.body or b"{}", request.runtime.options.limits.max_json_depth)
    except RequestError as exc:
        return errors.request_error(surfaces.of(request), exc)
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
    try:
        engine = request.runtime.require_engine()
        durable, body = await asyncio.to_thread(engine.flush_cache, FLUSH_TIMEOUT_S)
    except EngineError as exc:  # no model, or the engine stopped or did not answer in time
        return errors.engine_error(surfaces.of(request), exc)
    return JsonResponse(body, status=200 if durable else 503)
