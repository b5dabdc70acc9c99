"""The operational routes: `/health`, `/stats`, `/metrics`, the prompt-cache
admin routes (`/admin/cache/*`), `/admin/transcription/unload` and, in a
router's model process, `/admin/drain`, on the operations API
(`hearth/api.py`), answering errors in OpenAI's shape."""
from __future__ import annotations

import asyncio
import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Field, Schema

from core.surfaces import OPENAI
from core.version import __version__
from inference.engine.errors import EngineError, EngineTimeout
from inference.engine.speech import NoWhisperModel
from inference.protocols import chat, params
from serving import telemetry
from serving.router import child
from serving.routes import proxy

FLUSH_TIMEOUT_S = 120.0

router = OPENAI.router(tags=["ops"])


class Drain(Schema):
    drain_seconds: float = Field(default=30.0, ge=0, le=3600, description="how long running requests may take")
    flush_seconds: float = Field(default=120.0, ge=0, le=3600, description="how long the SSD tier's writes may take")


class NotAModelProcess(EngineError):
    status = 404
    type = "invalid_request_error"
    code = "not_a_model_process"


class SessionClose(Schema):
    session_id: str | None = None  # the session whose cached prompt may go; none or "" closes nothing


@router.get("/health", summary="Liveness, with the transcription state and the demo builds' progress")
def health(request: HttpRequest) -> JsonResponse:
    body: dict = {"status": "ok"}
    service = request.runtime.transcriber
    if service is not None and service.available:
        # /health answers without a key: the state, not which model (that is on /stats)
        body["transcription"] = {k: v for k, v in service.stats().items() if k != "model"}
    if request.runtime.demo_build is not None:  # the demo models training in the background
        body["demo_build"] = request.runtime.demo_build
    if request.runtime.speech_build is not None:
        body["speech_build"] = request.runtime.speech_build
    return JsonResponse(body)


@router.get("/props", summary="The served model's properties, as llama.cpp's server answers them")
def props(request: HttpRequest) -> JsonResponse:
    """Read-only: llama.cpp's POST /props (changing them) is not offered (405). In router
    mode the model the query names (`?model=`, else the default) answers from its process."""
    runtime = request.runtime
    engine = runtime.require_engine()
    model = engine.loaded_model
    defaults = runtime.options.defaults
    sampling = params.sampling({}, defaults, model.generation_config, model.vocab_size)
    template = getattr(chat.hf_tokenizer(model), "chat_template", None)
    return JsonResponse({
        "model_alias": model.model_id, "model_path": str(model.path), "total_slots": engine.capacity,
        "default_generation_settings": {
            "n_ctx": engine.context_limit,  # the window, or the cap in force
            "params": {"n_predict": defaults.max_tokens if defaults.max_tokens is not None else -1,
                       # top_p off is 1.0 in llama.cpp's terms (0 would keep only the likeliest token)
                       "temperature": sampling.temperature, "top_p": sampling.top_p or 1.0, "top_k": sampling.top_k,
                       "min_p": sampling.min_p,
                       "enable_thinking": defaults.thinking}},
        "chat_template": template if isinstance(template, str) else "",
        "modalities": {"vision": model.vision is not None,
                       "audio": runtime.transcriber is not None and runtime.transcriber.available},
        "build_info": f"hearth {__version__}", "is_sleeping": False})


@router.post("/admin/transcription/unload", summary="Page the Whisper weights out now")
async def transcription_unload(request: HttpRequest) -> JsonResponse:
    """Answers whether they were in, with the transcription stats block."""
    service = request.runtime.transcriber
    if service is None:
        raise NoWhisperModel("no Whisper model is configured (`hearth serve --whisper-model`)")
    try:
        unloaded = await asyncio.wait_for(asyncio.wrap_future(service.unload()), FLUSH_TIMEOUT_S)
    except TimeoutError:
        raise EngineTimeout("the engine stayed busy; try again later") from None
    return JsonResponse({"unloaded": unloaded, **service.stats()})


@router.get("/stats", summary="Counters of the engine, caches, batching and the router")
async def stats(request: HttpRequest) -> JsonResponse:
    body = telemetry.stats_body(request.runtime)
    if request.runtime.router is not None:  # with each loaded model's own
        return await proxy.stats(request, body)
    return JsonResponse(body)


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(request: HttpRequest) -> HttpResponse:
    body, content_type = telemetry.render_metrics(request.runtime)
    if request.runtime.router is not None:  # with each loaded model's series, labelled `model`
        return await proxy.metrics(request, body, content_type)
    return HttpResponse(body, content_type=content_type)


@router.post("/admin/cache/session/close", summary="Let a session's cached prompt go")
def cache_session_close(request: HttpRequest, body: SessionClose | None = None) -> JsonResponse:
    if body is None or not body.session_id:
        return JsonResponse({"closed": False})
    engine = request.runtime.engine
    if engine is not None:
        engine.close_session(body.session_id)
    return JsonResponse({"closed": True})


@router.post("/admin/cache/flush", summary="Write the prompt cache's entries to the SSD tier now")
async def cache_flush(request: HttpRequest) -> JsonResponse:
    """503 when the engine has no model, stopped, or did not answer in time, or when not every entry was written."""
    engine = request.runtime.require_engine()
    durable, body = await asyncio.to_thread(engine.flush_cache, FLUSH_TIMEOUT_S)
    return JsonResponse(body, status=200 if durable else 503)


@router.post("/admin/drain", summary="A router's model process: finish, write the prompt cache to the SSD tier")
async def drain(request: HttpRequest, body: Drain | None = None) -> JsonResponse:
    """Only in a model's process under a router (which alone holds its key):
    new requests get 503 from now on, running ones may finish (up to
    `drain_seconds`), then every prompt-cache entry not yet on the SSD tier
    is written (up to `flush_seconds`). The router calls it before it stops
    the process (an unload, an eviction, an idle unload), so the model's
    next start is warm; the process then waits for its SIGTERM."""
    if not child.is_child():
        raise NotAModelProcess("POST /admin/drain is answered by a router's model process only (the router calls "
                               "it before it stops one); to stop this server, send it SIGTERM")
    body = body or Drain()
    runtime = request.runtime
    engine = runtime.require_engine()
    started = time.monotonic()
    runtime.draining = runtime.drained_on_request = True  # hearth/asgi.py answers 503 to what comes next
    engine.stop_grammar_compiles()
    deadline = started + body.drain_seconds

    def busy() -> bool:  # this request is one of the inflight
        return engine.busy or runtime.inflight > 1 or runtime.streams.live_count() > 0
    while busy() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    idle = not busy()
    durable, report = await asyncio.to_thread(engine.flush_cache, body.flush_seconds)
    return JsonResponse({"drained": idle and durable, "idle": idle, "demotions": report["flushedSnapshots"],
                         "elapsed_ms": round((time.monotonic() - started) * 1000), "flush": report})
