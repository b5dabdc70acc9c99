"""The `/v1` client-protocol routes. Thin: read, adapt, call the engine, render."""
from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from ninja import Router

from hub.registry import servable_models
from inference import __version__
from inference.engine.engine import Engine, Submission
from inference.engine.errors import ContextLengthExceeded
from inference.engine.loader import LoadedModel
from inference.engine.types import GenerationRequest
from inference.protocols import chat, openai, params
from inference.protocols.errors import openai_error
from inference.runtime import runtime

log = logging.getLogger("hearth.api")
router = Router(tags=["openai"])

ENDPOINTS = ["POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models",
             "GET /v1/models/{id}", "POST /v1/messages",
             "POST /v1/messages/count_tokens", "POST /v1/responses", "GET /v1/responses/{id}",
             "DELETE /v1/responses/{id}", "POST /v1/embeddings", "GET /health", "GET /stats", "GET /metrics",
             "POST /admin/cache/session/close", "POST /admin/cache/flush"]


def submit(engine: Engine, request: GenerationRequest, param: str) -> Submission:
    """`engine.submit`, naming the request field (`messages`, `prompt`,
    `input`) a prompt too long for the model's window comes from. It raises
    before a streaming reply starts, so every refusal is a plain HTTP error."""
    try:
        return engine.submit(request)
    except ContextLengthExceeded as exc:
        exc.param = param
        raise


async def _generate(request: HttpRequest, kind: str) -> HttpResponse:
    engine = runtime.require_engine()
    model = engine.loaded
    body = await params.read_json_body(request.body)
    session = params.session_key(body, request.headers)
    if kind == "chat":
        prepared = await openai.prepare_chat(body, model, runtime.defaults, runtime.grammar_enabled,
                                             runtime.templates)
    else:
        prepared = await openai.prepare_completion(body, model, runtime.defaults, runtime.grammar_enabled)
    prepared.request.session = session
    submission = submit(engine, prepared.request, "messages" if kind == "chat" else "prompt")
    reply = openai.Reply(kind, model.model_id)
    if body.get("stream"):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **prepared.headers}
        frames = openai.stream(reply, submission.events(), prepared.output, runtime.sse_keepalive)
        return StreamingHttpResponse(frames, content_type="text/event-stream", headers=headers)
    message, logprobs, final = await openai.collect(submission.events(), prepared.output)
    if final.error is not None:
        kind = "server_error" if final.error_status >= 500 else "invalid_request_error"
        return JsonResponse(openai_error(final.error, kind, final.error_param), status=final.error_status)
    return JsonResponse(reply.complete(message, final.finish_reason, final.usage, logprobs),
                        headers=prepared.headers)


@router.post("/chat/completions")
async def chat_completions(request: HttpRequest):
    return await _generate(request, "chat")


@router.post("/completions")
async def completions(request: HttpRequest):
    return await _generate(request, "completion")


def _served_row(model: LoadedModel) -> dict:
    return {
        "id": model.model_id, "object": "model", "created": runtime.started_at, "owned_by": "hearth",
        "context_window": model.context_window, "reasoning": chat.thinks(model), "vision": False,
        "audio": False, "batch_mode": runtime.engine.mode if runtime.engine else "off",
        "tools": True, "structured_output": True, "embeddings": runtime.embeddings_enabled,
        "adapters": True, "training": True,
        "capabilities": {
            "chat_completions": bool(getattr(model.tokenizer, "chat_template", None)),
            "text_completions": True, "anthropic_messages": True, "responses": True,
            "streaming": True, "tools": True, "structured_output": True, "logprobs": True,
            "embeddings": runtime.embeddings_enabled, "vision": False, "audio": False, "adapters": True,
            "training": True,
        },
        "gen_defaults": params.gen_defaults(runtime.defaults, model.generation_config),
        "dtype": model.dtype,
    }


def _model_rows() -> list[dict]:
    rows = []
    if runtime.engine is not None and runtime.engine.loaded is not None:
        rows.append(_served_row(runtime.engine.loaded))
    served = {r["id"] for r in rows}
    for entry in servable_models():
        if entry.repo_id not in served:
            rows.append({"id": entry.repo_id, "object": "model", "created": runtime.started_at,
                         "owned_by": entry.repo_id.split("/")[0], "vision": entry.vision,
                         "tier": entry.support_tier})
    return rows


@router.get("/")
def index(request: HttpRequest):
    return api_index()


@router.get("/models")
def list_models(request: HttpRequest):
    return {"object": "list", "data": _model_rows()}


@router.get("/models/{path:model_id}")
def get_model(request: HttpRequest, model_id: str):
    return {"object": "list", "data": [r for r in _model_rows() if r["id"] == model_id]}


def api_index() -> dict:
    """GET /v1 (and /v1/): what this server is and which routes it answers."""
    model = runtime.engine.loaded.model_id if runtime.engine and runtime.engine.loaded else None
    return {"name": "hearth", "version": __version__, "model": model, "endpoints": ENDPOINTS}
