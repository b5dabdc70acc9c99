"""OpenAPI descriptions of request bodies that a route reads and checks
itself (the protocol modules' messages and `param` fields, or a job's whole
config), so the document lists them while the route keeps its own checks.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

NO_BODY: dict[str, Any] = {"x-no-body": True}  # `openapi_extra` of a POST or DELETE that reads no body


def documented(schema: type[BaseModel], more: dict[str, Any] | None = None) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body `schema` describes (`more`:
    other content types it takes, by name)."""
    content = {"application/json": {"schema": schema.model_json_schema()}, **(more or {})}
    return {"requestBody": {"required": True, "content": content}}
