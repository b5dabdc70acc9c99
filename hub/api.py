"""`/api/hub/*` (local models, search, downloads, serve), `/api/gc/*` and
`/api/fit/measure`."""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from ninja import Router

from core.api import fail, json_body
from hub import downloads, fit, gc, library
from hub.download import check_revision

router = Router(tags=["hub"])
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
SEARCH_TIMEOUT_S = 8.0


def _cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


@router.get("/hub/local")
def local(request: HttpRequest):
    rows = library.models(request.GET.get("refresh") in ("1", "true"))
    return {"ok": True, "models": [{**{k: v for k, v in m.row().items() if k != "audio"}, "assessment": verdict}
                                   for m, verdict in rows]}


@router.get("/hub/search")
def search(request: HttpRequest):
    from huggingface_hub import constants

    query = (request.GET.get("q") or "").strip()
    if not query:
        return fail("q required")
    if constants.HF_HUB_OFFLINE:
        return {"ok": True, "offline": True, "error": "HF_HUB_OFFLINE is set", "results": []}
    params = urllib.parse.urlencode({"search": query, "library": "mlx", "limit": 30, "sort": "downloads",
                                     "direction": -1})
    try:
        with urllib.request.urlopen(f"{constants.ENDPOINT}/api/models?{params}", timeout=SEARCH_TIMEOUT_S) as r:
            hits = json.loads(r.read())
        if not isinstance(hits, list):
            raise ValueError("the hub did not answer with a list")
    except (OSError, ValueError) as exc:  # DNS, refused, timeout, HTTP errors, bad JSON
        return {"ok": True, "offline": True, "error": f"{type(exc).__name__}: {exc}", "results": []}
    return {"ok": True, "offline": False, "results": [
        {"id": h.get("id") or h.get("modelId"), "downloads": h.get("downloads", 0), "likes": h.get("likes", 0),
         "size_estimate": None} for h in hits if isinstance(h, dict)]}


@router.post("/hub/download")
def start_download(request: HttpRequest):
    body = json_body(request)
    if isinstance(body, JsonResponse):
        return body
    repo, revision = body.get("repo"), body.get("revision", "main")
    if not isinstance(repo, str) or not REPO_ID.match(repo):
        return fail("repo required, as org/name")
    try:
        check_revision(revision if isinstance(revision, str) else "")
    except ValueError:
        return fail("revision must be a branch, tag or commit")
    try:
        downloads.start(repo, revision)
    except downloads.DuplicateDownload as exc:
        return fail(str(exc), 409)
    return {"ok": True, "repo": repo, "started": True}


@router.post("/hub/serve")
def serve(request: HttpRequest):
    body = json_body(request)
    if isinstance(body, JsonResponse):
        return body
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return fail("model required")
    return {"ok": False, "restart_required": True, "command": f"hearth serve {model}"}


def _busy() -> set[str]:
    from hub.models import Download

    return {d.repo_id for d in Download.objects.filter(state__in=("queued", "active"))
            if downloads.running(d.repo_id) is not None}


@router.get("/gc/plan")
def gc_plan(request: HttpRequest):
    repos = gc.plan(_cache(), _busy())
    rows = [r.row() for r in repos]
    return {"ok": True, "superseded": rows, "reclaim_bytes": sum(r["reclaim_bytes"] for r in rows)}


@router.post("/gc/execute")
def gc_execute(request: HttpRequest):
    body = json_body(request)
    if isinstance(body, JsonResponse):
        return body
    if body.get("yes") is not True:
        return fail('refusing to delete without {"yes": true}')
    result = gc.execute(_cache(), _busy())
    library.invalidate()
    return result


@router.post("/fit/measure")
async def measure(request: HttpRequest):
    """Decode with the served model through the engine and record the rate."""
    from hub.measure import measure_decode

    engine = request.runtime.require_engine()
    body = json_body(request)
    if isinstance(body, JsonResponse):
        return body
    tokens = body.get("tokens", 64)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 8 <= tokens <= 1024:
        return fail("tokens must be an integer from 8 to 1024")
    started = time.perf_counter()
    tps, count = await measure_decode(engine, tokens)
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
