"""LoRA hot-swap: `/v1/adapters` lists, mounts and unmounts adapters in the
running model. Mounting happens on the engine thread between forward
passes; requests pick adapters with their `adapter` field."""
from __future__ import annotations

import asyncio
from pathlib import Path

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse

from core.paths import ADAPTER_FILES, PathRefused, confine, confine_members
from core.surfaces import OPENAI
from inference.engine.errors import EngineTimeout
from inference.protocols.errors import RequestError
from serving.routes.bodies import AdapterMount

router = OPENAI.router(tags=["adapters"])
MOUNT_TIMEOUT_S = 120.0


@router.get("/adapters")
def mounted(request: HttpRequest):
    engine = request.runtime.require_engine()
    rows = engine.loaded.adapters.describe()
    keys = ("id", "path", "rank", "scale", "size_bytes", "mounted_layers", "ram_bytes")
    default = engine.loaded.adapters.default
    return {"adapters": [{k: row[k] for k in keys} for row in rows], "default": "+".join(default) or None}


@router.get("/adapters/available")
def available(request: HttpRequest):
    engine = request.runtime.require_engine()
    model = engine.loaded
    return {"adapters": request.runtime.adapter_records.available(model.adapters.describe(),
                                                                  [model.model_id, model.path])}


@router.post("/adapters")
async def mount(request: HttpRequest, body: AdapterMount):
    engine = request.runtime.require_engine()
    adapter_id, path = body.id, body.path
    try:  # inside the allowed roots, the files it reads included (one answer whether or not it exists)
        path = str(confine(path, "path"))
        confine_members(Path(path), ADAPTER_FILES, "path")
    except PathRefused as exc:
        raise RequestError(str(exc), "path") from None
    try:
        result = await asyncio.to_thread(engine.mount_adapter, adapter_id, path, False, MOUNT_TIMEOUT_S)
    except EngineTimeout:
        raise EngineTimeout(f"the engine is busy and has not mounted {adapter_id} within {MOUNT_TIMEOUT_S:.0f} s; "
                            "it will mount once the engine gets to it (see GET /v1/adapters)") from None
    await sync_to_async(request.runtime.adapter_records.register)(result.pop("path"), name=adapter_id, mounted=True)
    return result


@router.delete("/adapters/{adapter_id}")
async def unmount(request: HttpRequest, adapter_id: str):
    engine = request.runtime.require_engine()
    return JsonResponse(await asyncio.to_thread(engine.unmount_adapter, adapter_id))
