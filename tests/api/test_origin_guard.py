"""One guard for every state-changing route (hearth/middleware.py,
`CrossOriginGuardMiddleware`), in this process: every URL pattern the
project serves, walked from the URL conf, refuses a POST, PUT, PATCH or
DELETE that a page on another origin sends, with any content type (a
`text/plain` or form body needs no preflight, so a browser sends it from
any site), except the two routes meant for any origin. The same requests
without an `Origin`, as SDKs send them, pass the guard."""
from __future__ import annotations

import re

import pytest

EVIL = "https://evil.example"
ANY_ORIGIN = {"/signal", "/generate"}


def _concrete(route: str) -> str:
    """A path that a URL pattern matches: parameters and regex groups become `x`."""
    route = re.sub(r"<[^>]+>", "x", route)
    route = re.sub(r"\(\?P<\w+>[^)]*\)", "x", route)
    return "/" + route.replace("^", "").replace("$", "").replace("\\", "")


def _paths() -> list[str]:
    from django.urls import URLResolver, get_resolver

    def walk(patterns, prefix: str):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, route)
            else:
                yield _concrete(route)

    return sorted(set(walk(get_resolver().url_patterns, "")))


def test_the_walk_finds_every_surface(inproc):
    paths = _paths()
    for expected in ("/models/load", "/models/unload", "/models/default", "/models/pin", "/v1/chat/completions",
                     "/v1/messages", "/v1/responses", "/api/settings/hf-token", "/admin/cache/flush",
                     "/signin", "/signal"):
        assert expected in paths, expected
    assert len(paths) > 60


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/json"])
def test_a_foreign_page_changes_nothing_on_any_route(inproc, content_type):
    unguarded = []
    for path in _paths():
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            answer = inproc.request(method, path, content='{"model": "tiny"}',
                                    headers={"Origin": EVIL, "Content-Type": content_type})
            refused = answer.status_code == 403 and answer.headers["content-type"].startswith("application/json")
            if refused != (path not in ANY_ORIGIN):
                unguarded.append((method, path, answer.status_code))
    assert not unguarded, unguarded


def test_the_refusal_speaks_the_callers_protocol_and_sdks_pass(inproc):
    refused = inproc.post("/models/unload", content='{"model":"tiny"}',
                          headers={"Origin": EVIL, "Content-Type": "text/plain"})
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error" and EVIL in refused.json()["error"]["message"]
    on_v1 = inproc.post("/v1/chat/completions", json={"messages": []}, headers={"Origin": "null"})
    assert on_v1.status_code == 403 and on_v1.json()["error"]["code"] == "cross_origin"
    # No Origin (an SDK), or the server's own: past the guard, to the route's own answer.
    assert inproc.post("/models/unload", json={"model": "x"}).status_code != 403
    own = inproc.post("/models/unload", json={"model": "x"}, headers={"Origin": "http://127.0.0.1:8080"})
    assert own.status_code != 403
