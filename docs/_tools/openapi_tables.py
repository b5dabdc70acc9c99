"""mkdocs hook: the route tables of the HTTP reference, generated from the
two OpenAPI documents the app serves (`/v1/openapi.json`, `/api/openapi.json`).

A page asks for a table with a line of its own:

    <!-- routes v1 openai models -->

(the API, `v1` or `api`, then the OpenAPI tags to include, or `*` for all).
The hook loads Django in this process (`config.settings`, in a throwaway
HEARTH_HOME), reads `get_openapi_schema()` of each ninja API and puts a
method / path / summary / parameters table in the line's place. A route
that no page shows, a tag that matches nothing, or a plain Django route of
`config/urls.py` or an operations route (`/health`, `/models/*`, ...) that
no page names is a warning, so `mkdocs build --strict`
fails until the manual covers it."""
from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.openapi_tables")

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- routes (v1|api) ([\w*, -]+?) -->$", re.M)
METHODS = ("get", "post", "put", "patch", "delete")
MAX_FIELDS = 12

_schemas: dict[str, dict] = {}
_shown: set[tuple[str, str, str]] = set()
_plain_routes: list[str] = []
_site_text: list[str] = []


def _load() -> None:
    """Both OpenAPI documents and the plain (non-ninja) routes, from the code in this checkout."""
    if _schemas:
        return
    sys.path.insert(0, str(ROOT))  # this checkout's code, whatever an editable install points at
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["HEARTH_HOME"] = tempfile.mkdtemp(prefix="hearth-docs-")  # settings write nothing real
    os.environ.setdefault("HEARTH_SECRET_KEY", "docs-build")
    import django

    django.setup()
    from django.urls import URLPattern, URLResolver

    from config import urls
    from hearth.api import api, ops_api, v1

    _schemas["v1"] = v1.get_openapi_schema()
    _schemas["api"] = api.get_openapi_schema()
    # The operations API serves no document of its own: its routes are named in the prose, like plain ones.
    _plain_routes.extend(ops_api.get_openapi_schema(path_prefix="/")["paths"])
    for pattern in urls.urlpatterns:
        route = str(pattern.pattern)
        if isinstance(pattern, URLResolver) or not isinstance(pattern, URLPattern):
            continue  # /v1/, /api/ (the documents above) and /admin/ (Django's own)
        if route and "<" not in route:
            _plain_routes.append("/" + route)


def _resolve(schema: dict, components: dict) -> dict:
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        return components.get(ref.rsplit("/", 1)[1], {})
    return schema


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    match = re.match(r"(.+?\.)(\s|$)", text)
    return match.group(1) if match else text


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _inputs(op: dict, components: dict) -> str:
    parts = []
    query = [p["name"] for p in op.get("parameters", []) if p.get("in") == "query"]
    if query:
        parts.append("query " + ", ".join(f"`{name}`" for name in query))
    body = op.get("requestBody")
    if body:
        content = body.get("content", {})
        kind = next(iter(content), "application/json")
        schema = _resolve(content.get(kind, {}).get("schema", {}), components)
        required = set(schema.get("required", []))
        fields = sorted(schema.get("properties", {}), key=lambda f: f not in required)  # required ones first
        names = [f"`{f}`" + ("\\*" if f in required else "") for f in fields[:MAX_FIELDS]]
        if len(fields) > MAX_FIELDS:
            names.append(f"and {len(fields) - MAX_FIELDS} more")
        label = "form" if "multipart" in kind else "body"
        parts.append(f"{label} " + (", ".join(names) if names else "(JSON)"))
    return "; ".join(parts) or "—"


def _table(api: str, tags: list[str], page: str) -> str:
    doc = _schemas[api]
    components = doc.get("components", {}).get("schemas", {})
    rows = []
    for path, ops in doc["paths"].items():
        for method in METHODS:
            op = ops.get(method)
            if op is None or ("*" not in tags and not set(op.get("tags", [])) & set(tags)):
                continue
            _shown.add((api, method, path))
            what = op.get("summary", "")
            if op.get("description"):
                what += ": " + _first_sentence(op["description"])
            rows.append(f"| {method.upper()} | `{path}` | {_cell(what)} | {_cell(_inputs(op, components))} |")
    if not rows:
        log.warning("%s: no %s route has the tag(s) %s", page, api, ", ".join(tags))
        return ""
    head = ["| Method | Path | Summary | Takes (\\* required) |", "| --- | --- | --- | --- |"]
    note = (f"\n*Generated from `/{api}/openapi.json` when the manual is built; "
            f"the server's `/{api}/docs` page has every field.*\n")
    return "\n".join(head + rows) + "\n" + note


def on_config(config):
    _load()
    _shown.clear()
    _site_text.clear()
    return config


def on_page_markdown(markdown: str, page, config, files):
    def replace(match: re.Match) -> str:
        tags = [t for t in re.split(r"[\s,]+", match.group(2)) if t]
        return _table(match.group(1), tags, page.file.src_uri)

    markdown = MARKER.sub(replace, markdown)
    _site_text.append(markdown)
    return markdown


def on_post_build(config):
    for api, doc in _schemas.items():
        for path, ops in doc["paths"].items():
            for method in METHODS:
                if method in ops and (api, method, path) not in _shown:
                    log.warning("%s %s (/%s/openapi.json) is in no route table of the manual", method.upper(),
                                path, api)
    text = "\n".join(_site_text)
    for route in _plain_routes:
        if not re.search(r"`(?:(?:GET|POST|PUT|PATCH|DELETE|OPTIONS) )?" + re.escape(route) + r"(?=[`?\s|\\])", text):
            log.warning("the route %s (config/urls.py) is named on no page of the manual", route)
