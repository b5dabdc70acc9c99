"""The OpenAPI documents describe every route with its body, the docs pages
load from the server alone (no CDN), in a real browser with every other host
blocked, and `/api` answers in one key case with one error shape."""
from __future__ import annotations

import re

import httpx
import pytest

WITH_BODY = {"post", "put", "patch"}
SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")


@pytest.mark.parametrize("api", ["/v1", "/api"])
def test_every_route_with_a_body_documents_it(base_url, api):
    doc = httpx.get(f"{base_url}{api}/openapi.json").json()
    assert doc["paths"], doc
    methods = WITH_BODY | ({"delete"} if api == "/api" else set())  # /api's DELETEs take bodies too
    missing = [f"{method.upper()} {path}" for path, ops in doc["paths"].items() for method, op in ops.items()
               if method in methods and "requestBody" not in op and not op.get("x-no-body")]
    assert missing == []
    if api == "/v1":
        chat = doc["paths"]["/v1/chat/completions"]["post"]
        schema = chat["requestBody"]["content"]["application/json"]["schema"]
        assert "messages" in schema["required"] and "temperature" in schema["properties"]


def test_the_docs_pages_use_only_this_server(base_url, page):
    html = httpx.get(base_url + "/v1/docs").text
    scripts = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert scripts and all(not s.startswith(("http:", "https:", "//")) for s in scripts), scripts
    for asset in scripts:
        if asset.endswith((".js", ".css")):
            assert httpx.get(base_url + asset).status_code == 200, asset
    outside = []

    def only_here(route):
        if route.request.url.startswith(base_url):
            return route.continue_()
        outside.append(route.request.url)
        return route.abort()

    page.route("**/*", only_here)
    page.goto(base_url + "/v1/docs")
    page.wait_for_selector(".opblock-summary-path:has-text('/v1/chat/completions')", timeout=30_000)
    page.screenshot(path="tests/artifacts/screenshots/desktop-v1-docs.png")
    assert outside == []


def _keys(value, where: str = "") -> list[str]:
    """Every object key in `value`, with where it sits."""
    if isinstance(value, dict):
        return [f"{where}.{k}" for k in value] + [x for k, v in value.items() for x in _keys(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [x for item in value for x in _keys(item, where + "[]")]
    return []


def test_api_documents_its_bodies_and_query_parameters_in_snake_case(base_url):
    doc = httpx.get(base_url + "/api/openapi.json").json()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            names = [p["name"] for p in op.get("parameters", [])]
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            ref = body.get("$ref") or (body.get("allOf") or [{}])[0].get("$ref")
            body = doc["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else body
            names += list(body.get("properties", {}))
            assert all(SNAKE.match(n) for n in names), (method, path, names)
    search = doc["paths"]["/api/memory/search"]["get"]["parameters"]
    assert {p["name"] for p in search} == {"q", "scope", "limit", "mode", "vault"}
    revoke = doc["paths"]["/api/settings/tool-approvals"]["delete"]["requestBody"]
    assert revoke["content"]["application/json"]["schema"]


def test_get_routes_answer_in_snake_case(base_url):
    doc = httpx.get(base_url + "/api/openapi.json").json()
    plain = [path for path, ops in doc["paths"].items() if "get" in ops and "{" not in path]
    assert len(plain) >= 15, plain
    for path in plain:
        r = httpx.get(base_url + path, timeout=30)
        body = r.json()
        assert isinstance(body, dict) and isinstance(body.get("ok"), bool), (path, body)
        if r.status_code >= 400:
            assert body["ok"] is False and isinstance(body["error"], str), (path, body)
        odd = [k for k in _keys(body) if not SNAKE.match(k.rsplit(".", 1)[1])]
        assert odd == [], (path, odd)


@pytest.mark.parametrize("method, path, body, status, needle", [
    ("post", "/api/quantize/submit", b"{not json", 400, "invalid JSON body"),
    ("post", "/api/memory/init", b"{not json", 400, "invalid JSON body"),
    ("post", "/api/gc/execute", b"[]", 400, "expected an object"),
    ("post", "/api/dataset/submit", b"", 400, "a JSON object body is required"),
    ("post", "/api/quantize/submit", {}, 400, "model_id: Field required"),
    ("post", "/api/finetune/export", {"base_model": "x"}, 400, "adapter_path: Field required"),
    ("post", "/api/fit/measure", {"tokens": "many"}, 400, "tokens: "),
    ("get", "/api/memory/search?q=x&limit=lots", None, 400, "limit: "),
    ("get", "/api/jobs/nope", None, 404, "job not found"),
    ("post", "/api/jobs/nope/cancel", None, 404, "job not found"),
    ("post", "/api/finetune/inspect-dataset", {"path": "/etc"}, 400, "--allow-path"),
    ("post", "/api/finetune/export", {"base_model": "x", "adapter_path": "/etc"}, 400, "--allow-path"),
    ("post", "/api/memory/init", {"path": "/etc/hearth-vault"}, 400, "--allow-path"),
])
def test_api_errors_share_one_shape(base_url, method, path, body, status, needle):
    kwargs = {"content": body} if isinstance(body, bytes) else {} if body is None else {"json": body}
    r = httpx.request(method.upper(), base_url + path, timeout=30, **kwargs)
    answer = r.json()
    assert r.status_code == status and answer["ok"] is False, (r.status_code, answer)
    assert isinstance(answer["error"], str) and needle in answer["error"], answer
    assert set(answer) == {"ok", "error"}, answer
