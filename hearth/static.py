"""The dashboard's files (frontend/) and the installed apps' static files
(the admin's, the API docs'), served by WhiteNoise, a WSGI application,
beside Django rather than inside it: hearth/asgi.py hands it the requests
for `/assets/`, `/static/`, `/sw.js` and `/manifest.webmanifest` (`serves`),
through asgiref's `WsgiToAsgi`, after the Host check; `/v1` and every other
route never reach it. The pages (`/`, `/curves`) stay Django views behind
every access check and answer with WhiteNoise's file (`page`).

WhiteNoise serves a copy: at the first request, each source (frontend/,
and what Django's static finders list) is copied into
HEARTH_HOME/static-cache/<source>-<fingerprint>/ beside a gzip variant of
each file worth compressing (`whitenoise.compress`). The fingerprint is the
sources' names, sizes and mtimes, so a copy is made once per install,
upgrade or edit (an edit is served after a restart), never in the source
tree, and a running server never sees a file change under it. Copies no
server has started on for a week are removed.

Cache-Control: a vendored file whose name carries its version
(frontend/vendor/marked-15.0.12.js; a new version is a new name) never
changes, so it is cached for a year, `immutable`; the service worker and
the Curve Designer are never cached, the icon and the manifest for an hour
(CACHE); everything else, the shell, its modules and styles, the admin's
files, is revalidated on each use (`no-cache`, with ETag and
Last-Modified: a 304 when unchanged), so an upgrade never mixes old and
new modules.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from wsgiref.util import FileWrapper

from asgiref.wsgi import WsgiToAsgi
from django.conf import settings
from django.http import HttpResponse
from whitenoise import WhiteNoise
from whitenoise.compress import Compressor
from whitenoise.compress import main as compress

from core import home, surfaces

FRONTEND = Path(__file__).resolve().parent.parent / "frontend"
DASHBOARD = "/assets/"
APPS = "/" + settings.STATIC_URL.strip("/") + "/"
# Where browsers look for them: a service worker's scope is the folder it is served from.
AT_ROOT = {"/sw.js": "sw.js", "/manifest.webmanifest": "manifest.webmanifest"}
# A vendored file named by its version (marked-15.0.12.js) never changes: a new version is a new name.
VERSIONED = re.compile(r"/assets/vendor/[\w.-]+-\d+\.\d+\.\d+\.\w+")
FOREVER = "public, max-age=31536000, immutable"
# As the wire contract has them (the service worker and the Curve Designer never cached, the icon and the
# manifest for an hour); every other file is revalidated on each use.
CACHE = {"/sw.js": "no-store", "/assets/curves.html": "no-store", "/assets/curve-terrain.html": "no-store",
         "/manifest.webmanifest": "public, max-age=3600", "/assets/icon.svg": "public, max-age=3600"}
# Django's SecurityMiddleware adds these to its own answers.
SECURITY = (("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", settings.SECURE_REFERRER_POLICY),
            ("Cross-Origin-Opener-Policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY))
TYPES = {".webmanifest": "application/manifest+json"}
# gzip only: brotli at its default quality takes seconds for these files. Source maps are read by a
# browser's developer tools only, and are most of the bytes: left whole.
COMPRESS = ["--quiet", "--no-brotli"]
SKIP = [*Compressor.SKIP_COMPRESS_EXTENSIONS, "map"]
FORMAT = "1"  # what a copy holds; a change makes new copies
UNUSED_S = 7 * 24 * 3600
CHUNK = 256 * 1024

_lock = threading.Lock()
_files: WhiteNoise | None = None


def serves(path: str) -> bool:
    """Whether a request for `path` goes to WhiteNoise."""
    return path.startswith((DASHBOARD, APPS)) or path in AT_ROOT


def route(path: str) -> str:
    """The route label /metrics counts a request for `path` under (as Django's routes are counted)."""
    if path in AT_ROOT:
        return path[1:]
    return f"{(DASHBOARD if path.startswith(DASHBOARD) else APPS)[1:]}<path:name>"


def files() -> WhiteNoise:
    """WhiteNoise over this install's copies, made at first use."""
    global _files
    if _files is None:
        with _lock:
            if _files is None:
                served = WhiteNoise(_not_found, max_age=None, allow_all_origins=False, mimetypes=TYPES,
                                    add_headers_function=_headers)
                dashboard = _copy("dashboard", _dashboard_sources())
                served.add_files(dashboard, DASHBOARD)
                served.add_files(_copy("apps", _app_sources()), APPS)
                for url, name in AT_ROOT.items():
                    served.add_file_to_dictionary(url, str(dashboard / name))
                _files = served
    return _files


def _wsgi(environ, start_response):
    environ["wsgi.file_wrapper"] = _chunks
    return files()(environ, start_response)


def _chunks(file, size: int = CHUNK) -> FileWrapper:
    """A file's body in chunks of CHUNK bytes: each is a round trip from the
    WSGI thread to the event loop, so wsgiref's 8 KiB would make hundreds."""
    return FileWrapper(file, size)


application = WsgiToAsgi(_wsgi)


def page(request, name: str) -> HttpResponse:
    """The dashboard's file `name` as a Django view's answer: WhiteNoise's
    (validators, 304, gzip), read whole (a page is a few KB)."""
    answer = files().files[DASHBOARD + name].get_response(request.method, request.META)
    body = b""
    if answer.file is not None:
        with answer.file:
            body = answer.file.read()
    response = HttpResponse(body, status=answer.status)
    del response["Content-Type"]
    for header, value in answer.headers:
        response[header] = value
    return response


def _headers(headers, path: str, url: str) -> None:
    headers["Cache-Control"] = FOREVER if VERSIONED.fullmatch(url) else CACHE.get(url, "no-cache")
    for name, value in SECURITY:
        if value:
            headers[name] = value
    if url == "/sw.js":
        headers["Service-Worker-Allowed"] = "/"


def _not_found(environ, start_response):
    """What WhiteNoise answers for a path it holds no file for: the JSON 404 of every other route."""
    path = environ["PATH_INFO"].encode("latin-1").decode("utf-8", "replace")
    start_response("404 Not Found", [("Content-Type", "application/json"), *SECURITY[:1]])
    return [surfaces.for_path(path).error_bytes(404, "not found", "not_found")]


def _dashboard_sources() -> dict[str, Path]:
    return {path.relative_to(FRONTEND).as_posix(): path for path in sorted(FRONTEND.rglob("*"))
            if path.is_file() and path.name != "README.md"}


def _app_sources() -> dict[str, Path]:
    """What `collectstatic` would gather: every finder's files, the first of a name winning."""
    from django.apps import apps
    from django.contrib.staticfiles import finders

    ignore = apps.get_app_config("staticfiles").ignore_patterns
    found: dict[str, Path] = {}
    for finder in finders.get_finders():
        for name, storage in finder.list(ignore):
            prefix = (getattr(storage, "prefix", None) or "").strip("/")
            found.setdefault(f"{prefix}/{name}" if prefix else name, Path(storage.path(name)))
    return found


def _copy(source: str, sources: dict[str, Path]) -> Path:
    """The folder holding `sources` (relative name -> file) and their gzip
    variants, made now unless an earlier start made it."""
    cache = home.static_cache()
    cache.mkdir(parents=True, exist_ok=True)
    fingerprint = hashlib.sha256(FORMAT.encode())
    for name, path in sorted(sources.items()):
        stat = path.stat()
        fingerprint.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    folder = cache / f"{source}-{fingerprint.hexdigest()[:16]}"
    if not folder.is_dir():
        work = Path(tempfile.mkdtemp(prefix=f".{source}-", dir=cache))
        try:
            for name, path in sources.items():
                (work / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, work / name)  # keeps the mtime: Last-Modified and ETag survive a new copy
            compress([*COMPRESS, str(work), *SKIP])
            os.rename(work, folder)
        except OSError:
            if not folder.is_dir():  # else another process made it first
                raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    os.utime(folder)  # in use: kept from removal below
    _remove_unused(cache, folder)
    return folder


def _remove_unused(cache: Path, current: Path) -> None:
    cutoff = time.time() - UNUSED_S
    for entry in cache.iterdir():
        with contextlib.suppress(FileNotFoundError):  # another process removed it first
            if entry != current and entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry, ignore_errors=True)
