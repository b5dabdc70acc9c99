"""`/api/memory/*`: the Memory page's routes over a vault. Every failure is
`{"ok": false, "error": ...}` with a fitting status; `?vault=<name>` picks a
vault other than the default."""
from __future__ import annotations

from pathlib import Path

from django.http import HttpRequest, JsonResponse
from ninja import Router

from jobs.http import fail, json_body
from memory import git, index, service, vault
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
        except git.GitError as exc:
            return fail(str(exc), 409)

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
    found = index.search(root, service.index_path(root), query, scope, _limit(request, 50))
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
