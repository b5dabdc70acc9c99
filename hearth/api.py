"""The three ninja APIs and how each renders errors.

`/v1` speaks the client protocols (each route in its surface's shape:
OpenAI's, Anthropic's, Responses'); the operations API answers the routes
outside both prefixes (`/health`, `/stats`, `/metrics`, `/models/*`,
`/admin/*` but Django's admin, the Curve Designer's `/signal` and
`/generate`) in OpenAI's shape; `/api` serves the dashboard and answers
every error as `{"ok": false, "error": message}` (core.api). Typed errors
map to their status; anything unexpected is a 500 with the message only
and the stack in the log.
"""
from __future__ import annotations

import logging

from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser

from chat.api import router as sessions_router
from core import jsonbody, limits, surfaces
from core.api import ApiError, answer
from hearth.access_api import router as access_router
from hub.api import router as hub_router
from inference.engine.errors import EngineError
from inference.protocols.errors import RequestError
from jobs.api import router as jobs_router
from jobs.api_dataset import router as dataset_router
from jobs.api_push import router as push_router
from memory.api import router as memory_router
from memory.api import v1_router as memory_v1_router
from serving.routes import (
    adapters,
    anthropic,
    curve_designer,
    embeddings,
    errors,
    listing,
    model_slots,
    openai,
    ops,
    responses,
    streams,
)
from serving.routes import audio as v1_audio
from serving.routes import audio_sessions as v1_audio_sessions

log = logging.getLogger("hearth.api")

class StrictJson(Parser):
    """Bodies of schema-typed routes: strict JSON, nested at most
    HEARTH_MAX_JSON_DEPTH levels (ninja answers 400; `_parse_error` keeps the reason)."""

    def parse_body(self, request):
        return jsonbody.loads(request.body, limits.current().max_json_depth)


def _parse_error(exc: HttpError) -> str:
    cause = exc.__cause__
    return str(cause) if isinstance(cause, jsonbody.JsonRefused) else str(exc)


v1 = NinjaAPI(title="Hearth client protocols", version="1", urls_namespace="v1", docs_url="/docs",
              parser=StrictJson())
for module in (openai, anthropic, responses, streams, embeddings, listing, adapters):
    v1.add_router("", module.router)
for module in (v1_audio, v1_audio_sessions):  # speech to text
    v1.add_router("", module.router)
v1.add_router("", memory_v1_router)


class StrictJsonObject(StrictJson):
    """`/api` bodies are JSON objects (ninja would read `[]` or `null` as an
    object with no fields)."""

    def parse_body(self, request):
        return jsonbody.load_object(request.body, limits.current().max_json_depth)


api = NinjaAPI(title="Hearth dashboard API", version="1", urls_namespace="api", docs_url="/docs",
               parser=StrictJsonObject())
api.add_router("", jobs_router)
api.add_router("", dataset_router)
api.add_router("", push_router)
api.add_router("", hub_router)
api.add_router("", sessions_router)
api.add_router("", memory_router)
api.add_router("", access_router)


def _invalid(exc: NinjaValidationError) -> str:
    """`<field>: <reason>` for the first field ninja refused (a body field by
    its path inside the body, a query parameter by its name)."""
    first = exc.errors[0] if exc.errors else {}
    loc = [str(part) for part in first.get("loc", ())]
    in_body = loc[:1] == ["body"]
    where = loc[2:] if in_body else loc[1:]
    if not where:
        return "a JSON object body is required" if in_body else "invalid request"
    return f"{'.'.join(where)}: {first.get('msg', 'invalid')}"


def _as_api_error(request: HttpRequest, exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, NinjaValidationError):
        return ApiError(_invalid(exc))
    if isinstance(exc, HttpError):
        return ApiError(_parse_error(exc), exc.status_code)
    if isinstance(exc, Http404):
        return ApiError(str(exc) or "not found", 404)
    if isinstance(exc, EngineError):
        return ApiError(str(exc) or type(exc).__name__, exc.status)
    log.exception("unhandled error on %s", request.path)
    return ApiError(str(exc) or type(exc).__name__, 500)


def _api_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """The one `/api` error answer: `{"ok": false, "error": message}` with its status."""
    return answer(_as_api_error(request, exc))


# Ninja looks a handler up by the exception's class first: each kind it
# would otherwise render in its own shape is routed here. (Its decorator form
# registers the same way; add_exception_handler's typing has the handler take
# the exception's class as well, which ninja never passes.)
for _kind in (ApiError, NinjaValidationError, HttpError, Http404, EngineError, Exception):
    api.exception_handler(_kind)(_api_error)


def _request_error(request, exc: RequestError):
    return errors.request_error(surfaces.of(request), exc)


def _engine_error(request, exc: EngineError):
    return errors.engine_error(surfaces.of(request), exc)


def _validation_error(request, exc: NinjaValidationError):
    first = exc.errors[0] if exc.errors else {}
    loc = [str(part) for part in first.get("loc", ())]
    param = ".".join(loc[2:] if loc[:1] == ["body"] else loc[1:]) or None  # a body field by its path in the body
    return errors.render(surfaces.of(request), 400, f"{param or 'request'}: {first.get('msg', 'invalid')}", param=param)


def _http_error(request, exc: HttpError):
    return errors.render(surfaces.of(request), exc.status_code, _parse_error(exc))


def _unexpected(request, exc: Exception):
    return errors.unexpected(surfaces.of(request), exc, request.path)


# The operations routes take JSON objects only, like /api; they answer in OpenAI's shape, like /v1.
ops_api = NinjaAPI(title="Hearth operations", version="1", urls_namespace="ops", docs_url=None, openapi_url=None,
                   parser=StrictJsonObject())
for module in (ops, model_slots, curve_designer):
    ops_api.add_router("", module.router)

for protocol_api in (v1, ops_api):
    for kind, handler in ((RequestError, _request_error), (EngineError, _engine_error),
                          (NinjaValidationError, _validation_error), (HttpError, _http_error),
                          (Exception, _unexpected)):
        protocol_api.exception_handler(kind)(handler)
