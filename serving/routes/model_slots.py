"""Router mode's model management: `GET /models` (every model the router
can serve, with its state), `POST /models/load|unload|pin|default`, and
`GET /models/sse` (each model's state as it changes). A one-model server
answers `GET /models` with its model and refuses the rest with a 400 that
says how to start a router."""
from __future__ import annotations

import asyncio
import json

from django.http import HttpRequest, HttpResponse, JsonResponse

from core import sse, surfaces
from serving.router.manager import Manager
from serving.router.slots import RouterError
from serving.routes import errors

KEEPALIVE_S = 10.0


def _single(request: HttpRequest) -> JsonResponse:
    message = ("this server serves one model (started as `hearth serve MODEL`); start `hearth serve` without a "
               "model to load, unload and switch models")
    return surfaces.for_path(request.path).response(400, message, "router_mode_off")


class _BadBody(RouterError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_body"


def _body(request: HttpRequest) -> dict:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError as exc:
        raise _BadBody(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _BadBody("the body must be a JSON object such as {\"model\": \"org/name\"}")
    return body


def _model_field(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _BadBody("model is required: the id or alias of a model (GET /models lists them)")
    return model


async def models_list(request: HttpRequest) -> JsonResponse:
    manager: Manager | None = request.runtime.router
    if manager is None:
        return JsonResponse({"object": "list", "mode": "single", "default": _single_id(request),
                             "models_max": 1, "data": _single_rows(request)})
    return JsonResponse({"object": "list", "mode": "router", "default": manager.default,
                         "models_max": manager.settings.models_max, "data": manager.rows()})


def _single_id(request: HttpRequest) -> str | None:
    engine = request.runtime.engine
    return engine.loaded.model_id if engine is not None and engine.loaded is not None else None


def _single_rows(request: HttpRequest) -> list[dict]:
    model_id = _single_id(request)
    if model_id is None:
        return []
    return [{"id": model_id, "object": "model", "aliases": [], "tags": [], "pinned": True, "default": True,
             "status": {"value": "loaded"}, "inflight": request.runtime.inflight}]


async def _manage(request: HttpRequest, act) -> JsonResponse:
    manager: Manager | None = request.runtime.router
    if manager is None:
        return _single(request)
    if request.method != "POST":
        return surfaces.for_path(request.path).response(405, "use POST", "method_not_allowed")
    try:
        return JsonResponse(await act(manager, _body(request)))
    except RouterError as exc:
        return errors.engine_error(surfaces.for_path(request.path), exc)


async def models_load(request: HttpRequest) -> JsonResponse:
    async def act(manager: Manager, body: dict) -> dict:
        slot = await manager.load(_model_field(body), fetch=True)
        return {"ok": True, "model": slot.id, "status": slot.status_object()}
    return await _manage(request, act)


async def models_unload(request: HttpRequest) -> JsonResponse:
    async def act(manager: Manager, body: dict) -> dict:
        slot = await manager.unload(_model_field(body))
        return {"ok": True, "model": slot.id, "status": slot.status_object()}
    return await _manage(request, act)


async def models_pin(request: HttpRequest) -> JsonResponse:
    async def act(manager: Manager, body: dict) -> dict:
        pinned = body.get("pinned", True)
        if not isinstance(pinned, bool):
            raise _BadBody("pinned must be true or false")
        slot = manager.set_pinned(_model_field(body), pinned)
        return {"ok": True, "model": slot.id, "pinned": slot.pinned}
    return await _manage(request, act)


async def models_default(request: HttpRequest) -> JsonResponse:
    async def act(manager: Manager, body: dict) -> dict:
        slot = await manager.load(_model_field(body))  # a model that fails to load does not become the default
        manager.set_default(slot.id)
        return {"ok": True, "default": slot.id, "status": slot.status_object()}
    return await _manage(request, act)


async def models_sse(request: HttpRequest) -> HttpResponse:
    manager: Manager | None = request.runtime.router
    if manager is None:
        return _single(request)

    runtime = request.runtime

    async def events():
        queue = manager.listen()
        quiet = 0.0
        try:
            for row in manager.rows():
                yield sse.frame(row, "model")
            # A server shutting down ends the stream rather than wait for it; so does a listener the
            # router gave up on (it stopped reading), whose EventSource then connects again.
            while not runtime.draining and manager.listening(queue):
                try:
                    kind, data = await asyncio.wait_for(queue.get(), 1.0)
                except asyncio.TimeoutError:
                    quiet += 1.0
                    if quiet >= KEEPALIVE_S:
                        quiet = 0.0
                        yield b": keep-alive\n\n"
                    continue
                quiet = 0.0
                yield sse.frame(data, kind)
        finally:
            manager.unlisten(queue)

    return surfaces.OPENAI.sse(events())
