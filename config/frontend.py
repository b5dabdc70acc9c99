"""The dashboard's files, same-origin, from frontend/ (no CDN, no build
step): the shell at `/`, its modules and vendored libraries under
`/assets/`, the PWA manifest, the service worker and the Curve Designer
page at `/curves`. Legacy page paths
redirect to the single page's hash routes."""
from __future__ import annotations

import mimetypes
from pathlib import Path

from django.http import FileResponse, Http404, HttpRequest, HttpResponseRedirect
from django.views.decorators.http import require_safe

ROOT = Path(__file__).resolve().parent.parent / "frontend"
TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".txt": "text/plain",
         ".webmanifest": "application/manifest+json", ".html": "text/html"}
ASSET_CACHE = "public, max-age=3600"


def _file(path: Path, cache: str, request: HttpRequest | None = None):
    """The file, or a 304 when the browser's copy is current (our own modules
    are revalidated on every load so an upgrade never mixes versions)."""
    from django.http import HttpResponseNotModified
    from django.utils.http import http_date
    from django.views.static import was_modified_since

    mtime = path.stat().st_mtime
    if request is not None and not was_modified_since(request.headers.get("If-Modified-Since"), mtime):
        response = HttpResponseNotModified()
        response["Cache-Control"] = cache
        return response
    kind = TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    response = FileResponse(open(path, "rb"), content_type=f"{kind}; charset=utf-8" if "text" in kind or
                            kind.endswith(("json", "javascript")) else kind)
    response["Cache-Control"] = cache
    response["Last-Modified"] = http_date(mtime)
    response["X-Content-Type-Options"] = "nosniff"
    return response


@require_safe
def shell(request: HttpRequest) -> FileResponse:
    return _file(ROOT / "app.html", "no-cache", request)


@require_safe
def asset(request: HttpRequest, name: str) -> FileResponse:
    path = (ROOT / name).resolve()
    if ROOT not in path.parents or path.suffix not in TYPES or not path.is_file():
        raise Http404(name)
    vendored = (ROOT / "vendor") in path.parents or path.suffix == ".svg"
    return _file(path, ASSET_CACHE if vendored else "no-cache", request)


@require_safe
def manifest(request: HttpRequest) -> FileResponse:
    return _file(ROOT / "manifest.webmanifest", ASSET_CACHE)


@require_safe
def service_worker(request: HttpRequest) -> FileResponse:
    response = _file(ROOT / "sw.js", "no-store")
    response["Service-Worker-Allowed"] = "/"
    return response


@require_safe
def curves(request: HttpRequest) -> FileResponse:
    """The Curve Designer (drives POST /signal and POST /generate)."""
    return _file(ROOT / "curves.html", "no-store")


def legacy(request: HttpRequest, page: str) -> HttpResponseRedirect:
    return HttpResponseRedirect(f"/#/{page}")
