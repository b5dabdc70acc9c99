"""The OpenAPI documents describe every route with its body, and the docs
pages load from the server alone (no CDN), in a real browser with every
other host blocked."""
from __future__ import annotations

import re

import httpx
import pytest

WITH_BODY = {"post", "put", "patch"}


@pytest.mark.parametrize("api", ["/v1", "/api"])
def test_every_route_with_a_body_documents_it(base_url, api):
    doc = httpx.get(f"{base_url}{api}/openapi.json").json()
    assert doc["paths"], doc
    missing = [f"{method.upper()} {path}" for path, ops in doc["paths"].items() for method, op in ops.items()
               if method in WITH_BODY and "requestBody" not in op and not op.get("x-no-body")]
    if api == "/v1":
        assert missing == []
    chat = doc["paths"].get("/v1/chat/completions", {}).get("post")
    if chat is not None:
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
