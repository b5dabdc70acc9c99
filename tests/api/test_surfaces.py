"""Every route answers a bad body in its surface's shape (core/surfaces.py):
Anthropic's on Messages, OpenAI's on the rest of `/v1` and the routes
outside the APIs, `{"ok": false}` on `/api`, never with a 2xx and never a
500; and each ninja route hangs on the router of the surface it speaks."""
from __future__ import annotations

import re

import pytest

from core import surfaces

BAD_BODIES = [b"[1", b'{"a": ' * 100 + b"1" + b"}" * 100, b"[]", b'"text"']
WITH_BODY = ("post", "put", "patch", "delete")


@pytest.fixture(scope="module")
def app(served):
    return served("--no-worker")


def _routes(api, prefix: str) -> list[tuple[str, str]]:
    doc = api.get_openapi_schema(path_prefix=prefix)
    return [(method, re.sub(r"\{[^}]+\}", "x", path)) for path, ops in doc["paths"].items()
            for method, op in ops.items() if method in WITH_BODY and "requestBody" in op]


def _check(answer, surface: surfaces.Surface, where: str) -> None:
    assert 400 <= answer.status_code < 500, (where, answer.status_code, answer.text[:300])
    body = answer.json()
    if surface is surfaces.ANTHROPIC:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, (where, body)
    elif surface is surfaces.API:
        assert body["ok"] is False and isinstance(body["error"], str) and body["error"], (where, body)
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, (where, body)
        assert body["error"]["message"], (where, body)


def test_every_route_answers_a_bad_body_in_its_surfaces_shape(app):
    from hearth.api import api, ops_api, v1

    # The Curve Designer's two read their bodies themselves (their refusals carry CORS headers).
    designer = [("post", "/signal"), ("post", "/generate")]
    routes = [*_routes(v1, "/v1/"), *_routes(api, "/api/"), *_routes(ops_api, "/"), *designer]
    assert len(routes) > 40 and ("post", "/models/load") in routes and ("post", "/admin/cache/session/close") in routes
    for method, path in routes:
        surface = surfaces.for_path(path)
        for body in BAD_BODIES:
            answer = app.request(method.upper(), path, content=body, headers={"content-type": "application/json"})
            _check(answer, surface, f"{method.upper()} {path} {body[:10]!r}")


def test_each_ninja_route_hangs_on_its_surfaces_router():
    """The surface comes from the router a route is on (the shapes above), and
    the routers are the ones the protocols' paths call for."""
    from hearth.api import api, ops_api, v1

    seen = {}
    for ninja_api in (v1, api, ops_api):
        for _, router in ninja_api._routers:
            marks = [deco for deco, mode in router._decorators if mode == "view"]
            for path in router.path_operations:
                owner = {m.__self__ for m in marks if isinstance(getattr(m, "__self__", None), surfaces.Surface)}
                seen[path] = owner
    assert seen and all(len(owner) == 1 for owner in seen.values()), seen
    by_path = {path: next(iter(owner)) for path, owner in seen.items()}
    assert by_path["/messages"] is surfaces.ANTHROPIC and by_path["/messages/count_tokens"] is surfaces.ANTHROPIC
    assert by_path["/responses"] is surfaces.RESPONSES and by_path["/chat/completions"] is surfaces.OPENAI
    assert by_path["/jobs"] is surfaces.API
    assert by_path["/models/load"] is by_path["/admin/cache/flush"] is by_path["/signal"] is surfaces.OPENAI


def test_a_stream_error_ends_each_protocols_stream_in_its_shape():
    import json

    def data(frame: bytes) -> dict:
        return json.loads(frame.decode().split("data: ", 1)[1])

    assert data(surfaces.OPENAI.stream_error("boom")) == {"error": {"message": "boom", "type": "server_error",
                                                                    "param": None, "code": "server_error"}}
    anthropic = surfaces.ANTHROPIC.stream_error("boom")
    assert anthropic.startswith(b"event: error\n") and data(anthropic)["error"] == {"type": "api_error",
                                                                                   "message": "boom"}
    responses = surfaces.RESPONSES.stream_error("boom")
    assert responses.startswith(b"event: error\n") and data(responses)["code"] == "server_error"
    assert data(surfaces.SOCKET.stream_error("boom")) == {"type": "error", "message": "boom"}


def test_a_503_is_logged_once_at_info_and_a_500_as_an_error():
    """A 503 says "not now" (a model loading or training, a drain): one INFO line, not Django's ERROR
    for every 5xx beside the API's own; a fault is still an error on both."""
    import logging

    import django
    from django.http import HttpResponse
    from django.test import RequestFactory
    from django.utils.log import log_response

    from inference.engine.errors import EngineClosed, ModelLoadError
    from serving.routes import errors

    django.setup()  # the settings' logging, as a server has it
    rf = RequestFactory()
    records: list[logging.LogRecord] = []
    catch = logging.Handler(logging.INFO)
    catch.emit = records.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(catch)
    try:
        assert errors.engine_error(surfaces.OPENAI, EngineClosed("the server is shutting down")).status_code == 503
        log_response("Service Unavailable: %s", "/v1/chat/completions", response=HttpResponse(status=503),
                     request=rf.post("/v1/chat/completions"))
        errors.engine_error(surfaces.OPENAI, ModelLoadError("weights unreadable"))
        log_response("Internal Server Error: %s", "/v1/chat/completions", response=HttpResponse(status=500),
                     request=rf.post("/v1/chat/completions"))
    finally:
        logging.getLogger().removeHandler(catch)
    seen = [(r.name, r.levelname, r.getMessage()) for r in records if r.name in ("hearth.api", "django.request")]
    assert seen == [("hearth.api", "INFO", "EngineClosed: the server is shutting down"),
                    ("hearth.api", "ERROR", "ModelLoadError: weights unreadable"),
                    ("django.request", "ERROR", "Internal Server Error: /v1/chat/completions")], seen


def test_the_requests_hearth_sends_are_not_logged_one_a_line():
    """httpx logs each request at INFO: a router's forwarded requests, the hub's,
    a command's calls to the server. The settings' logging keeps them out."""
    import logging

    import django
    import httpx
    import httpx2

    django.setup()
    records: list[logging.LogRecord] = []
    catch = logging.Handler(logging.INFO)
    catch.emit = records.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(catch)
    try:
        for http in (httpx, httpx2):  # httpx2: what huggingface_hub and the SDKs send with here
            with http.Client(transport=http.MockTransport(lambda request, http=http: http.Response(200))) as client:
                assert client.get("http://127.0.0.1:1/v1/models").status_code == 200
    finally:
        logging.getLogger().removeHandler(catch)
    assert [r.getMessage() for r in records if r.name.startswith("httpx")] == []
