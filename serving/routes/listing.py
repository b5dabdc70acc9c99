"""`GET /v1/models`, `/v1/models/{id}` and the `/v1` index."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from core.surfaces import OPENAI
from core.version import __version__
from hub.registry import servable_models
from inference.engine.engine import Engine
from inference.engine.errors import ModelNotFound
from inference.protocols import chat, params

router = OPENAI.router(tags=["models"])


class UnknownModel(ModelNotFound):
    param = "model"

ENDPOINTS = ["POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models",
             "GET /v1/models/{id}", "POST /v1/messages",
             "POST /v1/messages/count_tokens", "POST /v1/responses", "GET /v1/responses/{id}",
             "DELETE /v1/responses/{id}", "GET /v1/stream/{conversation_id}",
             "DELETE /v1/stream/{conversation_id}", "POST /v1/streams/lookup", "POST /v1/embeddings",
             "GET /health", "GET /stats", "GET /metrics",
             "POST /admin/cache/session/close", "POST /admin/cache/flush", "GET /models", "POST /models/load",
             "POST /models/unload", "POST /models/pin", "POST /models/default", "GET /models/sse"]
ENDPOINTS += ["POST /v1/audio/transcriptions", "POST /v1/audio/translations", "POST /v1/audio/sessions",
              "POST /v1/audio/sessions/{id}/audio", "POST /v1/audio/sessions/{id}/finish",
              "DELETE /v1/audio/sessions/{id}", "POST /admin/transcription/unload"]


def transcription(runtime) -> bool:
    """Whether this server transcribes speech (a Whisper model is configured):
    the audio routes answer, and chat's audio parts are transcribed into text.
    In router mode the default model's process answers them."""
    if runtime.router is not None:
        return runtime.whisper_model is not None and runtime.router.default is not None
    service = getattr(runtime, "transcriber", None)
    return service is not None and service.available


def served_row(runtime, engine: Engine) -> dict:
    from serving.demo.build import trained_tools

    model = engine.loaded_model
    return {
        "id": model.model_id, "object": "model", "created": runtime.started_at, "owned_by": "hearth",
        "aliases": list(runtime.aliases), "tags": list(runtime.tags),
        "context_window": model.context_window,
        "context_limit": engine.context_limit,  # what a request may hold here: the window, or the operator's cap
        "reasoning": chat.thinks(model), "vision": model.vision is not None,
        "audio": False, "batch_mode": engine.mode,
        "tools": True, "trained_tools": trained_tools(model.path),  # null: any tool; a list: only those
        "structured_output": True, "embeddings": runtime.embeddings_enabled,
        "adapters": True, "training": True,
        "capabilities": {
            "chat_completions": bool(getattr(model.tokenizer, "chat_template", None)),
            "text_completions": True, "anthropic_messages": True, "responses": True,
            "streaming": True, "tools": True, "structured_output": True, "logprobs": True,
            "embeddings": runtime.embeddings_enabled, "vision": model.vision is not None, "audio": False,
            "adapters": True,
            "training": True,
        },
        "gen_defaults": params.gen_defaults(runtime.options.defaults, model.generation_config),
        "dtype": model.dtype,
        "transcription": transcription(runtime),
    }


def _router_rows(runtime) -> list[dict]:
    """Every model the router can serve, with its status; a loaded one with
    what its process says of itself."""
    rows = []
    for row in runtime.router.rows():
        slot = runtime.router.slots.get(row["id"])
        info = slot.info if slot is not None and row["status"]["value"] == "loaded" else {}
        rows.append({**info, "id": row["id"], "object": "model", "created": int(row["loaded_at"] or
                                                                              runtime.started_at),
                     "owned_by": info.get("owned_by") or row["id"].split("/")[0], "status": row["status"],
                     "aliases": row["aliases"], "tags": row["tags"], "pinned": row["pinned"],
                     "default": row["default"]})
    return rows


def _model_rows(runtime) -> list[dict]:
    if runtime.router is not None:
        return _router_rows(runtime)
    rows = [{**served_row(runtime, e), "status": {"value": "loaded"}}
            for e in runtime.engines.values() if e.loaded is not None]
    served = {r["id"] for r in rows}
    for entry in servable_models():
        if entry.repo_id not in served:
            rows.append({"id": entry.repo_id, "object": "model", "created": runtime.started_at,
                         "owned_by": entry.repo_id.split("/")[0], "vision": entry.vision,
                         "tier": entry.support_tier, "status": {"value": "unloaded"}})
    return rows


def index_body(runtime) -> dict:
    """GET /v1 (and /v1/): what this server is and which routes it answers."""
    return {"name": "hearth", "version": __version__, "model": runtime.served_model(),
            "mode": "router" if runtime.router is not None else "single", "endpoints": ENDPOINTS,
            "transcription": transcription(runtime)}


@router.get("/")
def index(request: HttpRequest):
    return index_body(request.runtime)


def index_view(request: HttpRequest) -> JsonResponse:
    """`/v1` without the slash (outside the ninja API)."""
    return JsonResponse(index_body(request.runtime))


@router.get("/models")
def list_models(request: HttpRequest):
    return {"object": "list", "data": _model_rows(request.runtime)}


@router.get("/models/{path:model_id}")
def get_model(request: HttpRequest, model_id: str):
    """One model object, by id or alias; 404 `model_not_found` when this server cannot serve it."""
    for row in _model_rows(request.runtime):
        if row["id"] == model_id or model_id in row.get("aliases", ()):
            return row
    raise UnknownModel(f"The model '{model_id}' does not exist on this server (GET /v1/models lists the models it "
                       "can serve)")
