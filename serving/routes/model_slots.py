"""Router mode's model management: `GET /models` (every model the router
can serve, with its state), `POST /models/load|unload|pin|default`,
`GET /models/sse` (each model's state as it changes), and `GET /engine`
(`hearth serve MODEL --isolate`: the model's process). A one-model server
answers `GET /models` with its model and refuses the rest with a 400 that
says how to start a router. On the operations API (`hearth/api.py`), errors
in OpenAI's shape."""
from __future__ import annotations

import asyncio
from typing import Annotated

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Field, Schema
from pydantic import StrictBool, StringConstraints

from core import sse
from core.surfaces import OPENAI
from serving.router.manager import Manager
from serving.router.slots import RouterError

KEEPALIVE_S = 10.0

router = OPENAI.router(tags=["models"])


class RouterModeOff(RouterError):
    status = 400
    type = "invalid_request_error"
    code = "router_mode_off"


class NotIsolated(RouterError):
    status = 404
    type = "invalid_request_error"
    code = "not_isolated"


class ModelName(Schema):
    model: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] = Field(
        description="the id or alias of a model (GET /models lists them)")


class Pin(ModelName):
    pinned: StrictBool = Field(True, description="true to keep the model loaded, false to let it go idle")


def _manager(request: HttpRequest) -> Manager:
    manager: Manager | None = request.runtime.router
    if manager is None:
        raise RouterModeOff("this server serves one model (started as `hearth serve MODEL`); start `hearth serve` "
                            "without a model to load, unload and switch models")
    return manager


@router.get("/models", summary="Every model this server can serve, with its state")
async def models_list(request: HttpRequest) -> JsonResponse:
    manager: Manager | None = request.runtime.router
    if manager is None:
        return JsonResponse({"object": "list", "mode": "single", "default": _single_id(request),
                             "models_max": 1, "data": _single_rows(request)})
    return JsonResponse({"object": "list", "mode": "router", "isolated": manager.settings.isolated,
                         "default": manager.default, "models_max": manager.settings.models_max,
                         "data": manager.rows()})


@router.get("/engine", summary="--isolate: the served model's process, its restarts and the stored turns")
async def engine(request: HttpRequest) -> JsonResponse:
    """Read only: looking never loads the model. `pid` and `port` are null
    while its process is down (between an exit and its restart)."""
    manager: Manager | None = request.runtime.router
    if manager is None or not manager.settings.isolated or manager.default is None:
        raise NotIsolated("GET /engine describes the model process of `hearth serve MODEL --isolate`; this "
                          "server does not run one")
    slot = manager.slots[manager.default]
    return JsonResponse({
        "isolated": True, "model": slot.id, "pid": slot.child.pid if slot.child is not None else None,
        "port": slot.port, "status": slot.status_object(), "restarts": slot.restarts,
        "last_exit": slot.last_exit, "last_drain": slot.last_drain,
        "memory_bytes": slot.child.rss_bytes() if slot.child is not None else None,
        "response_store": await asyncio.to_thread(request.runtime.responses.stats)})


def _single_id(request: HttpRequest) -> str | None:
    engine = request.runtime.engine
    return engine.loaded.model_id if engine is not None and engine.loaded is not None else None


def _single_rows(request: HttpRequest) -> list[dict]:
    model_id = _single_id(request)
    if model_id is None:
        return []
    others = max(request.runtime.inflight - 1, 0)  # this request is one of the inflight
    return [{"id": model_id, "object": "model", "aliases": [], "tags": [], "pinned": True, "default": True,
             "status": {"value": "loaded"}, "inflight": others}]


@router.post("/models/load", summary="Load a model into a process of its own")
async def models_load(request: HttpRequest, body: ModelName) -> dict:
    slot = await _manager(request).load(body.model, fetch=True)
    return {"ok": True, "model": slot.id, "status": slot.status_object()}


@router.post("/models/unload", summary="Stop a model's process")
async def models_unload(request: HttpRequest, body: ModelName) -> dict:
    slot = await _manager(request).unload(body.model)
    return {"ok": True, "model": slot.id, "status": slot.status_object()}


@router.post("/models/pin", summary="Keep a model loaded (never evicted or unloaded when idle), or let it go")
async def models_pin(request: HttpRequest, body: Pin) -> dict:
    slot = _manager(request).set_pinned(body.model, body.pinned)
    return {"ok": True, "model": slot.id, "pinned": slot.pinned}


@router.post("/models/default", summary="Load a model and make it the one requests without `model` get")
async def models_default(request: HttpRequest, body: ModelName) -> dict:
    manager = _manager(request)
    slot = await manager.load(body.model)  # a model that fails to load does not become the default
    manager.set_default(slot.id)
    return {"ok": True, "default": slot.id, "status": slot.status_object()}


@router.get("/models/sse", summary="Each model's state as server-sent events, as it changes")
async def models_sse(request: HttpRequest) -> HttpResponse:
    manager = _manager(request)
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

    return OPENAI.sse(events())
