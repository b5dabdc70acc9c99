"""`/api/memory/*`: the Memory page's routes over a vault. Every failure is
`{"ok": false, "error": ...}` with a fitting status; `?vault=<name>` picks a
vault other than the default."""
from __future__ import annotations

import json
from pathlib import Path

from django.http import HttpRequest, JsonResponse
from ninja import Router

from core.api import fail, json_body
from core.paths import PathRefused
from memory import git, service, vault
from memory.models import MemoryVault

router = Router(tags=["memory"])
MAX_LIMIT = 200
SCOPES = ("all", "articles", "reference")


def _limit(request: HttpRequest, default: int) -> int:
    raw = request.GET.get("limit")
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise vault.VaultError("limit must be a whole number") from None
    if value < 1:
        raise vault.VaultError("limit must be at least 1")
    return min(value, MAX_LIMIT)


def _with_vault(view):
    """Find the request's vault (or answer that there is none) and turn vault
    and git errors into `{"ok": false}` answers."""

    def wrapper(request: HttpRequest):
        name = request.GET.get("vault") or None
        found = service.find(name)
        if found is None or not Path(found.root).is_dir():
            body = service.no_vault(name)
            if found is not None:
                body["error"], body["root"] = f"the vault folder {found.root} is missing", found.root
            return JsonResponse(body, status=200 if view.__name__ == "status" else 404)
        try:
            return view(request, found, Path(found.root))
        except vault.VaultError as exc:
            return fail(str(exc), exc.status)
        except PathRefused as exc:  # a FIFO or device where a document was expected
            return fail(str(exc), 400)
        except git.GitError as exc:
            return fail(str(exc), 409)
        except OSError as exc:  # a name the file system refuses
            return fail(f"cannot read that: {exc.strerror or exc}", 400)

    # Not functools.wraps: ninja would read the view's own parameters as query fields.
    wrapper.__name__ = view.__name__
    return wrapper


@router.get("/memory/vaults")
def vaults(request: HttpRequest):
    return {"ok": True, "vaults": [v.row() for v in MemoryVault.objects.all()],
            "defaultRoot": str(service.default_root())}


@router.get("/memory/status")
@_with_vault
def status(request, row: MemoryVault, root: Path):
    return {"ok": True, "enabled": True, "vault": row.row(), "status": vault.status(root)}


@router.get("/memory/list")
@_with_vault
def listing(request, row, root: Path):
    return {"ok": True, "articles": vault.articles(root), "reference": vault.references(root)}


@router.get("/memory/search")
@_with_vault
def search(request, row, root: Path):
    query = (request.GET.get("q") or "").strip()
    if not query:
        return fail("q required")
    scope = request.GET.get("scope") or "all"
    if scope not in SCOPES:
        return fail("scope must be all, articles or reference")
    found = service.search(root, query, scope, _limit(request, 50), request.GET.get("mode"),
                           request.runtime.embedding_engine())
    return {"ok": True, **found}


@router.get("/memory/article")
@_with_vault
def article(request, row, root: Path):
    return {"ok": True, **vault.read_article(root, request.GET.get("name"))}


@router.get("/memory/links")
@_with_vault
def links(request, row, root: Path):
    return {"ok": True, **vault.links(root, request.GET.get("name"))}


@router.get("/memory/history")
@_with_vault
def history(request, row, root: Path):
    return {"ok": True, **vault.history(root, request.GET.get("name"), _limit(request, 50))}


@router.get("/memory/diff")
@_with_vault
def diff(request, row, root: Path):
    return {"ok": True, **vault.diff(root, request.GET.get("name"), request.GET.get("rev"))}


@router.post("/memory/init")
def init(request: HttpRequest):
    body = json_body(request)
    if isinstance(body, JsonResponse):
        return body
    try:
        row, result = service.init(body.get("path"), body.get("name"))
    except vault.VaultError as exc:
        return fail(str(exc), exc.status)
    except (git.GitError, OSError) as exc:
        return fail(f"could not set up the vault: {exc}", 409)
    return {"ok": True, "result": result, "vault": row.row(), "status": vault.status(Path(row.root))}


def _start(request: HttpRequest, name: str | None, dry: bool):
    """Start a synthesis of the named (or default) vault: the run, or the failure answer."""
    from memory import synthesize

    runtime = request.runtime
    row = service.find(name)
    if row is None or not Path(row.root).is_dir():
        return JsonResponse(service.no_vault(name), status=404)
    if not dry and runtime.engine is None:
        return fail("no model is being served here; synthesis asks the served model", 503)
    api_url = runtime.local_url or f"{request.scheme}://{request.get_host()}"
    model = runtime.engine.loaded.model_id if runtime.engine is not None else None
    try:
        return synthesize.start(row, dry, api_url, model)
    except vault.VaultError as exc:
        return fail(str(exc), exc.status)


@router.post("/memory/synthesize")
def synthesize_job(request: HttpRequest):
    body = json_body(request)
    if isinstance(body, JsonResponse):
        return body
    name, dry = body.get("vault"), body.get("dry", False)
    if (name is not None and not isinstance(name, str)) or not isinstance(dry, bool):
        return fail("vault must be a vault name and dry true or false")
    run = _start(request, name, dry)
    if isinstance(run, JsonResponse):
        return run
    return {"ok": True, "jobId": run.job_id, "job_id": run.job_id, "vault": run.vault.name, "dry": dry,
            "sessions": run.session_count}


# `GET /v1/memory/synthesize`: the same job, its progress as SSE frames (`stage`, `done`, `error`).
v1_router = Router(tags=["memory"])


def _sse(frame: dict | str) -> bytes:
    return f"data: {frame if isinstance(frame, str) else json.dumps(frame, ensure_ascii=False)}\n\n".encode()


async def _synthesis_frames(job_id: str, dry: bool):
    from jobs.api import job_events

    yield _sse({"type": "log", "message": f"synthesis job {job_id}{' (dry run)' if dry else ''}; it keeps running "
                                          f"if this stream closes (cancel: POST /api/jobs/{job_id}/cancel)"})
    # The stream ends once the worker has recorded the job's end (job_events
    # returns then), so a client that starts the next run on [DONE] is never
    # told that this one is still running.
    done = False
    async for event in job_events(job_id):
        kind = (event or {}).get("type")
        if event is None:
            yield b": keep-alive\n\n"
        elif kind == "stage":
            yield _sse({"type": "stage", "stage": event.get("stage"), "message": event.get("message")})
        elif kind == "log" and event.get("message"):
            yield _sse({"type": "log", "message": event["message"]})
        elif kind == "done":
            summary = event.get("summary") or {}
            yield _sse({"type": "done", "message": f"synthesis done — {summary.get('note', '')}"})
            yield _sse({"type": "summary", **summary})
            done = True
        elif kind == "failed":
            yield _sse({"type": "error", "message": event.get("error") or "synthesis failed"})
            return
    if done:
        yield _sse("[DONE]")


@v1_router.get("/memory/synthesize")
def synthesize_stream(request: HttpRequest):
    from django.http import StreamingHttpResponse

    dry = request.GET.get("dry") in ("1", "true", "yes")
    run = _start(request, request.GET.get("vault") or None, dry)
    if isinstance(run, JsonResponse):
        from inference.protocols.errors import openai_error

        body = json.loads(run.content)
        return JsonResponse(openai_error(body.get("error", "synthesis could not start")), status=run.status_code)
    return StreamingHttpResponse(_synthesis_frames(run.job_id, dry), content_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
