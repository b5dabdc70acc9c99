"""`/api/memory/*`: the Memory page's routes over a vault. Every failure
raises ApiError (`{"ok": false, "error": ...}` with a fitting status);
`?vault=<name>` picks a vault other than the default."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from django.http import HttpRequest
from ninja import Query, Schema
from pydantic import Field, StrictBool

from core import home, sse
from core.api import ApiError
from core.paths import PathRefused
from core.surfaces import API, OPENAI
from memory import git, service, vault
from memory.models import MemoryVault

router = API.router(tags=["memory"])
MAX_LIMIT = 200
VAULT = "a vault's name; default: the default vault"


class InitRequest(Schema):
    path: str | None = Field(default=None, description="the vault's folder; default: HEARTH_HOME/memory/<name>")
    name: str | None = Field(default=None, description="1-64 letters, digits, '.', '_' or '-'")


class SynthesizeRequest(Schema):
    """A synthesis job's submit body (the synthesis kind's schema, registered in `memory/apps.py`)."""

    vault: str | None = Field(default=None, description=VAULT)
    dry: StrictBool = Field(default=False, description="plan only: no model calls, no writes")
    model: str | None = Field(default=None, description="the model that writes the articles (router mode: "
                                                        "an id or alias); default: the served or default model")


# What an empty body means (every field at its default).
DEFAULT_INIT, DEFAULT_SYNTHESIS = InitRequest(), SynthesizeRequest()


def _no_vault(name: str | None, row: MemoryVault | None) -> dict:
    """`enabled: false` with why, and where the vault would (or should) live."""
    found = service.no_vault(name)
    if row is not None:
        found["error"], found["root"] = f"the vault folder {row.root} is missing", row.root
    return {"enabled": False, "error": found["error"], "root": found["root"]}


def _vault(name: str | None) -> MemoryVault:
    """The named (or default) vault whose folder exists; a 404 with `enabled: false` otherwise."""
    row = service.find(name)
    if row is None or not Path(row.root).is_dir():
        missing = _no_vault(name, row)
        raise ApiError(missing.pop("error"), 404, **missing)
    return row


@contextmanager
def _reading() -> Iterator[None]:
    """Vault, path, git and file-system errors inside become ApiErrors."""
    try:
        yield
    except vault.VaultError as exc:
        raise ApiError(str(exc), exc.status) from None
    except PathRefused as exc:  # a FIFO or device where a document was expected
        raise ApiError(str(exc), 400) from None
    except git.GitError as exc:
        raise ApiError(str(exc), 409) from None
    except OSError as exc:  # a name the file system refuses
        raise ApiError(f"cannot read that: {exc.strerror or exc}", 400) from None


@router.get("/memory/vaults")
def vaults(request: HttpRequest) -> dict:
    return {"ok": True, "vaults": [v.row() for v in MemoryVault.objects.all()],
            "default_root": str(home.vaults())}


@router.get("/memory/status")
def status(request: HttpRequest, vault_name: str | None = Query(None, alias="vault", description=VAULT)) -> dict:
    """With no vault, memory is off: a 200 with `enabled: false`, the `reason` and the `root` a vault
    would get (a state the dashboard shows, not an error)."""
    row = service.find(vault_name)
    model = _synthesis_model(request)
    if row is None or not Path(row.root).is_dir():
        missing = _no_vault(vault_name, row)
        return {"ok": True, "enabled": False, "reason": missing["error"], "root": missing["root"],
                "synthesis_model": model}
    with _reading():
        return {"ok": True, "enabled": True, "vault": row.row(),
                "status": vault.status(Path(row.root)), "synthesis_model": model}


def _synthesis_model(request: HttpRequest) -> dict:
    """The model a synthesis would ask, and whether it is one of Hearth's demo
    models, which can chat a little but cannot write articles worth keeping."""
    from serving.demo.build import is_demo

    model = request.runtime.served_model()
    return {"model": model, "demo": bool(model and is_demo(model))}


@router.get("/memory/list")
def listing(request: HttpRequest, vault_name: str | None = Query(None, alias="vault", description=VAULT)) -> dict:
    root = Path(_vault(vault_name).root)
    with _reading():
        return {"ok": True, "articles": vault.articles(root), "reference": vault.references(root)}


@router.get("/memory/search")
def search(request: HttpRequest, q: str = Query("", description="words to find"),
           scope: Literal["all", "articles", "reference"] = "all",
           limit: int = Query(50, ge=1, description=f"at most {MAX_LIMIT} are answered"),
           mode: Literal["fts", "hybrid"] | None = Query(None, description="hybrid: with the served model's "
                                                                          "embeddings"),
           vault_name: str | None = Query(None, alias="vault", description=VAULT)) -> dict:
    root = Path(_vault(vault_name).root)
    query = q.strip()
    if not query:
        raise ApiError("q required")
    with _reading():
        found = service.search(root, query, scope, min(limit, MAX_LIMIT), mode, request.runtime.embedding_engine())
    return {"ok": True, **found}


@router.get("/memory/article")
def article(request: HttpRequest, name: str | None = Query(None, description="an article, or Reference/<doc>"),
            vault_name: str | None = Query(None, alias="vault", description=VAULT)) -> dict:
    root = Path(_vault(vault_name).root)
    with _reading():
        return {"ok": True, **vault.read_article(root, name)}


@router.get("/memory/links")
def links(request: HttpRequest, name: str | None = None,
          vault_name: str | None = Query(None, alias="vault", description=VAULT)) -> dict:
    root = Path(_vault(vault_name).root)
    with _reading():
        return {"ok": True, **vault.links(root, name)}


@router.get("/memory/history")
def history(request: HttpRequest, name: str | None = None, limit: int = Query(50, ge=1),
            vault_name: str | None = Query(None, alias="vault", description=VAULT)) -> dict:
    root = Path(_vault(vault_name).root)
    with _reading():
        return {"ok": True, **vault.history(root, name, min(limit, MAX_LIMIT))}


@router.get("/memory/diff")
def diff(request: HttpRequest, name: str | None = None,
         rev: str | None = Query(None, description="a commit hash, 4 to 40 lowercase hex digits"),
         vault_name: str | None = Query(None, alias="vault", description=VAULT)) -> dict:
    root = Path(_vault(vault_name).root)
    with _reading():
        return {"ok": True, **vault.diff(root, name, rev)}


@router.post("/memory/init")
def init(request: HttpRequest, body: InitRequest = DEFAULT_INIT) -> dict:
    try:
        row, result = service.init(body.path, body.name)
    except vault.VaultError as exc:
        raise ApiError(str(exc), exc.status) from None
    except (git.GitError, OSError) as exc:
        raise ApiError(f"could not set up the vault: {exc}", 409) from None
    return {"ok": True, "result": result, "vault": row.row(),
            "status": vault.status(Path(row.root))}


def _start(request: HttpRequest, name: str | None, dry: bool, model_name: str | None = None):
    """Start a synthesis of the named (or default) vault: the run, or ApiError."""
    from memory import synthesize

    runtime = request.runtime
    row = _vault(name)
    if not dry and runtime.served_model() is None:
        raise ApiError("no model is being served here; synthesis asks the served model", 503)
    api_url = runtime.local_url or f"{request.scheme}://{request.get_host()}"
    model = runtime.job_model(model_name)
    try:
        return synthesize.start(row, dry, api_url, model)
    except vault.VaultError as exc:
        raise ApiError(str(exc), exc.status) from None


@router.post("/memory/synthesize")
def synthesize_job(request: HttpRequest, body: SynthesizeRequest = DEFAULT_SYNTHESIS) -> dict:
    run = _start(request, body.vault, body.dry, body.model)
    return {"ok": True, "job_id": run.job_id, "vault": run.vault.name, "dry": body.dry,
            "sessions": run.session_count}


# `GET /v1/memory/synthesize`: the same job, its progress as SSE frames (`stage`, `done`, `error`).
v1_router = OPENAI.router(tags=["memory"])


async def _synthesis_frames(job_id: str, dry: bool):
    from jobs.api import job_events

    started = f"synthesis job {job_id}{' (dry run)' if dry else ''}"
    yield sse.frame({"type": "log", "message": f"{started}; it keeps running if this stream closes "
                                               f"(cancel: POST /api/jobs/{job_id}/cancel)"})
    # The stream ends once the worker has recorded the job's end (job_events
    # returns then), so a client that starts the next run on [DONE] is never
    # told that this one is still running.
    done = False
    async for event in job_events(job_id):
        kind = (event or {}).get("type")
        if event is None:
            yield sse.KEEP_ALIVE
        elif kind == "stage":
            yield sse.frame({"type": "stage", "stage": event.get("stage"), "message": event.get("message")})
        elif kind == "log" and event.get("message"):
            yield sse.frame({"type": "log", "message": event["message"]})
        elif kind == "done":
            summary = event.get("summary") or {}
            yield sse.frame({"type": "done", "message": f"synthesis done — {summary.get('note', '')}"})
            yield sse.frame({"type": "summary", **summary})
            done = True
        elif kind == "failed":
            yield sse.frame({"type": "error", "message": event.get("error") or "synthesis failed"})
            return
    if done:
        yield sse.frame("[DONE]")


@v1_router.get("/memory/synthesize")
def synthesize_stream(request: HttpRequest, dry: bool = Query(False, description="plan only"),
                      vault_name: str | None = Query(None, alias="vault", description=VAULT),
                      model: str | None = Query(None, description="the model that writes (router mode)")):
    """A refusal in the OpenAI error shape, as everywhere on `/v1`."""
    try:
        run = _start(request, vault_name or None, dry, model)
    except ApiError as exc:
        return OPENAI.response(exc.status, exc.message)
    return OPENAI.sse(_synthesis_frames(run.job_id, dry))
