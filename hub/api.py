"""`/api/hub/*` (local models, search, downloads, serve), `/api/gc/*` and
`/api/fit/measure`."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from ninja import Query, Schema
from pydantic import ConfigDict, Field, StrictBool

from core.api import ApiError
from core.paths import REPO_ID
from core.surfaces import API
from hub import downloads, fit, gc, library, reach
from hub.download import check_revision

router = API.router(tags=["hub"])
SEARCH_TIMEOUT_S = 8.0
MAX_REPO_CHARS = 256  # Download.repo_id (the hub's own ids are far shorter)


class DownloadRequest(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    repo: str = Field(..., pattern=REPO_ID.pattern, max_length=MAX_REPO_CHARS, description="org/name on the Hub")
    revision: str = Field("main", description="a branch, tag or commit")


class ServeRequest(Schema):
    model: str = Field(..., min_length=1, description="a repo id or a model folder")


class GcRequest(Schema):
    yes: StrictBool = Field(default=False, description="true deletes what a fresh plan lists")


class MeasureRequest(Schema):
    tokens: int = Field(default=64, ge=8, le=1024, strict=True, description="tokens to decode, 8 to 1024")


# What an empty body means (every field at its default).
NOT_CONFIRMED, DEFAULT_MEASURE = GcRequest(), MeasureRequest()


def _cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


@router.get("/hub/local")
def local(request: HttpRequest, refresh: bool = Query(False, description="rescan the cache")) -> dict:
    rows = library.models(refresh)
    return {"ok": True, "models": [{**{k: v for k, v in m.row().items() if k != "audio"}, "assessment": verdict}
                                   for m, verdict in rows]}


@router.get("/hub/search")
def search(request: HttpRequest, q: str = Query("", description="words to look for")) -> dict:
    from huggingface_hub import constants

    query = q.strip()
    if not query:
        raise ApiError("q required")
    if constants.HF_HUB_OFFLINE:
        return {"ok": True, "offline": True, "error": reach.OFFLINE, "results": []}
    params = urllib.parse.urlencode({"search": query, "library": "mlx", "limit": 30, "sort": "downloads",
                                     "direction": -1})
    try:
        with urllib.request.urlopen(f"{constants.ENDPOINT}/api/models?{params}", timeout=SEARCH_TIMEOUT_S) as r:
            hits = json.loads(r.read())
        if not isinstance(hits, list):
            raise ValueError("the hub did not answer with a list")
    except (OSError, ValueError) as exc:  # DNS, refused, timeout, HTTP errors, bad JSON
        message = reach.failure(exc) or f"The Hugging Face Hub ({reach.endpoint()}) gave no model list."
        return {"ok": True, "offline": True, "error": message, "detail": reach.detail(exc), "results": []}
    return {"ok": True, "offline": False, "results": [
        {"id": h.get("id") or h.get("modelId"), "downloads": h.get("downloads", 0), "likes": h.get("likes", 0),
         "size_estimate": None} for h in hits if isinstance(h, dict)]}


@router.post("/hub/download")
def start_download(request: HttpRequest, body: DownloadRequest) -> dict:
    repo, revision = body.repo, body.revision
    try:
        check_revision(revision)
    except ValueError:
        raise ApiError("revision: must be a branch, tag or commit") from None
    try:
        downloads.start(repo, revision)
    except downloads.DuplicateDownload as exc:
        raise ApiError(str(exc), 409) from None
    return {"ok": True, "repo": repo, "started": True}


@router.post("/hub/serve")
async def serve(request: HttpRequest, body: ServeRequest) -> dict:
    """Router mode: load the model and make it the default, live. One
    model's server cannot switch: 409, with the command that serves the
    model (or how to start the router)."""
    if request.runtime.router is None:
        raise ApiError(f"this server serves one model and cannot switch: restart it with `hearth serve {body.model}`,"
                       " or run the router (`hearth serve`) to switch live", 409, restart_required=True,
                       command=f"hearth serve {body.model}", router_command="hearth serve")
    return await request.runtime.switch_model(body.model)


def _busy() -> set[str]:
    from hub.models import Download

    return {d.repo_id for d in Download.objects.filter(state__in=("queued", "active"))
            if downloads.running(d.repo_id) is not None}


@router.get("/gc/plan")
def gc_plan(request: HttpRequest) -> dict:
    repos = gc.plan(_cache(), _busy())
    rows = [r.row() for r in repos]
    return {"ok": True, "superseded": rows, "reclaim_bytes": sum(r["reclaim_bytes"] for r in rows)}


@router.post("/gc/execute")
def gc_execute(request: HttpRequest, body: GcRequest = NOT_CONFIRMED) -> dict:
    if body.yes is not True:
        raise ApiError('refusing to delete without {"yes": true}')
    result = gc.execute(_cache(), _busy())
    library.invalidate()
    return result


@router.post("/fit/measure")
async def measure(request: HttpRequest, body: MeasureRequest = DEFAULT_MEASURE) -> dict:
    """Decode with the served model through the engine and record the rate."""
    from hub.measure import measure_decode

    engine = request.runtime.require_engine()
    started = time.perf_counter()
    tps, count = await measure_decode(engine, body.tokens)
    from hub.models import DecodeMeasurement

    loaded = engine.loaded
    row = await sync_to_async(DecodeMeasurement.objects.create)(
        repo_id=loaded.model_id, snapshot=str(loaded.path), decode_tps=tps, tokens=count, lane=engine.lane.name)
    machine = await sync_to_async(library.this_machine)()
    context = count + 16  # about the prompt plus what it decoded
    predicted = fit.assess(loaded.weights_bytes, loaded.kv_bytes_per_token, machine.usable_bytes,
                           machine.decode_bandwidth_gbs, loaded.context_window, context)["predicted_decode_tps"]
    return {"ok": True, "decode_tps": round(tps, 2), "tokens": count, "lane": row.lane,
            "predicted_decode_tps": predicted, "context_tokens": context,
            "seconds": round(time.perf_counter() - started, 2)}
