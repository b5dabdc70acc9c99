"""The static files, in this process (hearth/static.py): WhiteNoise
answers for the static prefixes only, never for `/v1` or any other route;
a year's `immutable` cache for the vendored files whose names carry their
version, `no-cache` with ETag and Last-Modified (a 304 when unchanged) for
everything else; gzip variants for clients that accept them; the copies
made under HEARTH_HOME, never in the source tree, once per fingerprint;
the Host check before any of it; the pages and legacy paths as before."""
from __future__ import annotations

import gzip
import os
import re
import time

import pytest

from tests.helpers import ROOT

FRONTEND = ROOT / "frontend"
FOREVER = "public, max-age=31536000, immutable"
GZIP = {"Accept-Encoding": "gzip"}
IDENTITY = {"Accept-Encoding": "identity"}


@pytest.fixture()
def app(served):
    return served("--no-worker")


def _raw(app, path: str, headers: dict):
    """The answer with its body as sent (httpx would undo the gzip)."""
    with app.stream("GET", path, headers=headers) as r:
        return r, b"".join(r.iter_raw())


def _vendored(app) -> list[str]:
    shell = app.get("/").text
    found = re.findall(r'"(/assets/vendor/[^"]+)"', shell)
    assert len(found) == 4, found  # marked, highlight.js and its two themes
    return found


def test_each_kind_of_file_has_its_cache_control(app):
    kinds = {"/assets/js/main.js": "no-cache", "/assets/js/chat.js": "no-cache", "/assets/app.css": "no-cache",
             "/assets/vendor/LICENSES.txt": "no-cache", "/static/admin/css/base.css": "no-cache",
             "/assets/icon.svg": "public, max-age=3600", "/manifest.webmanifest": "public, max-age=3600",
             "/sw.js": "no-store", "/curves": "no-store", "/": "no-cache"}
    for path, cache in kinds.items():
        r = app.get(path)
        assert r.status_code == 200, path
        assert r.headers["cache-control"] == cache, path
        assert r.headers["etag"] and r.headers["last-modified"], path
        assert r.headers["x-content-type-options"] == "nosniff", path
    for path in _vendored(app):
        r = app.get(path)
        assert r.status_code == 200 and r.headers["cache-control"] == FOREVER, path
    assert app.get("/assets/js/main.js").headers["content-type"].startswith("text/javascript")
    assert app.get("/static/admin/css/base.css").headers["content-type"].startswith("text/css")
    worker = app.get("/sw.js")
    assert worker.headers["service-worker-allowed"] == "/" and "hearth-shell" in worker.text
    manifest = app.get("/manifest.webmanifest")
    assert manifest.json()["start_url"] == "/"
    assert manifest.headers["content-type"].startswith("application/manifest+json")
    assert "access-control-allow-origin" not in manifest.headers  # same-origin files, as before


def test_a_vendored_file_is_named_by_its_version(app):
    """So a year's `immutable` is right: a new version is a new URL."""
    from hearth.static import VERSIONED

    licenses = (FRONTEND / "vendor" / "LICENSES.txt").read_text()
    vendored = sorted(p for p in (FRONTEND / "vendor").iterdir() if p.name != "LICENSES.txt")
    assert vendored
    for path in vendored:
        assert VERSIONED.fullmatch(f"/assets/vendor/{path.name}"), path.name
        version = re.search(r"-(\d+\.\d+\.\d+)\.\w+$", path.name).group(1)
        assert version in licenses, path.name
        if path.suffix == ".js":
            assert version in path.read_text()[:300], f"{path.name}'s own header names another version"
    assert sorted(_vendored(app)) == sorted(f"/assets/vendor/{p.name}" for p in vendored)
    worker = (FRONTEND / "sw.js").read_text()
    assert all(f"/assets/vendor/{p.name}" in worker for p in vendored)


def test_gzip_to_those_who_accept_it(app):
    for path in ("/assets/js/main.js", _vendored(app)[2], "/static/admin/css/base.css", "/"):
        source = app.get(path, headers=IDENTITY)
        assert "content-encoding" not in source.headers, path
        r, body = _raw(app, path, GZIP)
        assert r.headers["content-encoding"] == "gzip" and "Accept-Encoding" in r.headers["vary"], path
        assert int(r.headers["content-length"]) == len(body) < len(source.content), path
        assert gzip.decompress(body) == source.content, path
    assert source.content == (FRONTEND / "app.html").read_bytes()
    # Source maps are for a browser's developer tools: kept whole.
    r, _ = _raw(app, "/static/ninja/swagger-ui-bundle.js.map", GZIP)
    assert r.status_code == 200 and "content-encoding" not in r.headers


def test_an_unchanged_file_is_a_304(app):
    for path in ("/assets/js/main.js", _vendored(app)[0], "/static/admin/css/base.css", "/", "/curves"):
        first = app.get(path)
        again = app.get(path, headers={"If-None-Match": first.headers["etag"]})
        assert again.status_code == 304 and again.content == b"", path
        assert again.headers["etag"] == first.headers["etag"], path
        assert again.headers["cache-control"] == first.headers["cache-control"], path
        since = app.get(path, headers={"If-Modified-Since": first.headers["last-modified"]})
        assert since.status_code == 304, path
    assert app.get("/assets/js/main.js", headers={"If-None-Match": '"other"'}).status_code == 200


def test_whitenoise_answers_for_the_static_prefixes_and_nothing_else(app, monkeypatch):
    import hearth.asgi
    from hearth import static

    reached = {"whitenoise": [], "django": []}

    def spy(name, inner):
        async def call(scope, receive, send):
            reached[name].append(scope["path"])
            await inner(scope, receive, send)
        return call

    monkeypatch.setattr(static, "application", spy("whitenoise", static.application))
    monkeypatch.setattr(hearth.asgi, "django_app", spy("django", hearth.asgi.django_app))
    files = ["/assets/js/main.js", "/static/admin/css/base.css", "/sw.js", "/manifest.webmanifest",
             "/assets/nope.js"]
    for path in files:
        app.get(path)
    with app.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200 and "data: [DONE]" in r.read().decode()
    for path in ("/v1/models", "/health", "/", "/curves", "/chat", "/assetsx", "/staticfile", "/sw.jsx"):
        app.get(path)
    assert reached["whitenoise"] == files
    assert reached["django"] == ["/v1/chat/completions", "/v1/models", "/health", "/", "/curves", "/chat",
                                 "/assetsx", "/staticfile", "/sw.jsx"]


def test_a_rebinding_host_and_other_methods_are_refused(app):
    for path in ("/assets/js/main.js", "/static/admin/css/base.css", "/sw.js", "/"):
        r = app.get(path, headers={"Host": "attacker.example"})
        assert r.status_code == 403, path
        assert "attacker.example" in r.json()["error"]["message"] and r.json()["error"]["code"] == "cross_origin"
    for method in ("POST", "PUT", "DELETE"):
        r = app.request(method, "/assets/js/main.js", content=b"x", headers={"Origin": "https://evil.example"})
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
        assert r.json()["error"]["code"] == "method_not_allowed"
    head = app.request("HEAD", "/assets/js/main.js", headers=IDENTITY)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == (FRONTEND / "js" / "main.js").stat().st_size
    for path in ("/assets/nope.js", "/assets/README.md", "/static/nope.css", "/assets/%2e%2e/config/settings.py"):
        missing = app.get(path)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found", path


def test_pages_and_legacy_paths(app):
    shell = app.get("/")
    assert shell.status_code == 200 and "/assets/js/main.js" in shell.text
    assert shell.headers["cross-origin-opener-policy"] == "same-origin"  # a Django page: SecurityMiddleware's
    curves = app.get("/curves")
    assert curves.status_code == 200 and "/assets/js/curves.js" in curves.text
    for page in ("status", "chat", "quantize", "finetune", "dataset"):
        r = app.get(f"/{page}")
        assert r.status_code == 302 and r.headers["location"] == f"/#/{page}"


def test_static_requests_are_counted(app):
    app.get("/assets/app.css")
    app.get("/assets/app.css", headers={"Host": "attacker.example"})
    metrics = app.get("/metrics").text
    assert re.search(r'hearth_http_requests_total\{method="GET",route="assets/<path:name>",status="200"\} \d', metrics)
    assert re.search(r'hearth_http_requests_total\{method="GET",route="assets/<path:name>",status="403"\} \d', metrics)


def test_copies_are_made_once_under_hearth_home_and_never_in_the_source_tree(app, homes):
    app.get("/assets/js/main.js")
    cache = homes[1] / "static-cache"
    copies = sorted(p.name for p in cache.iterdir())
    assert [name.split("-")[0] for name in copies] == ["apps", "dashboard"]
    dashboard = cache / copies[1]
    assert (dashboard / "js" / "main.js.gz").is_file() and not (dashboard / "README.md").exists()
    assert not [p for p in FRONTEND.rglob("*") if p.suffix in (".gz", ".br")]


def test_a_copy_is_kept_while_its_sources_are_unchanged(tmp_path, monkeypatch):
    from core import home
    from hearth import static

    monkeypatch.setattr(home, "static_cache", lambda: tmp_path / "cache")
    source = tmp_path / "source.js"
    source.write_text("console.log('hello');\n" * 50)
    first = static._copy("mine", {"source.js": source})
    assert (first / "source.js").read_bytes() == source.read_bytes()
    assert gzip.decompress((first / "source.js.gz").read_bytes()) == source.read_bytes()
    assert static._copy("mine", {"source.js": source}) == first
    source.write_text("console.log('edited');\n" * 50)
    second = static._copy("mine", {"source.js": source})
    assert second != first and first.is_dir()  # another server may still be serving the first
    week_ago = time.time() - 8 * 24 * 3600
    os.utime(first, (week_ago, week_ago))
    assert static._copy("mine", {"source.js": source}) == second and not first.exists()


def test_with_a_key_the_files_stay_public_and_the_pages_ask_to_sign_in(served):
    keyed = served("--no-worker", "--api-key", "static-test-key")
    assert keyed.get("/assets/js/main.js").status_code == 200
    assert keyed.get("/static/admin/css/base.css").status_code == 200
    page = keyed.get("/", headers={"Accept": "text/html"})
    assert page.status_code == 302 and page.headers["location"] == "/signin?next=/"
    assert keyed.get("/", headers={"Authorization": "Bearer static-test-key"}).status_code == 200


def test_one_kept_alive_connection_takes_files_and_routes_in_turn(base_url):
    """Under daphne (a real server: its connection handling is what is
    tested), a request that follows a static file on the same connection
    is answered, whichever side serves it."""
    import httpx

    order = ["/assets/js/main.js", "/assets/app.css", "/health", "/static/admin/css/base.css", "/v1/models",
             "/sw.js", "/", "/assets/icon.svg", "/manifest.webmanifest"]
    with httpx.Client(base_url=base_url, timeout=30, limits=httpx.Limits(max_connections=1)) as http:
        answers = [(path, http.get(path).status_code) for path in order * 2]
    assert answers == [(path, 200) for path in order * 2]
