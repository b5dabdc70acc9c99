"""`GET /library`, `GET /fit` and `GET /downloads`."""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from core import surfaces
from hub import fit, library, registry


def _served(request):
    """The model this process serves (the runtime's default engine), or None."""
    engine = request.runtime.engine
    return engine.loaded if engine is not None and engine.loaded is not None else None


@require_GET
async def library_view(request: HttpRequest) -> JsonResponse:
    refresh = request.GET.get("refresh") in ("1", "true", "yes")
    rows = await sync_to_async(library.models)(refresh)
    served = _served(request)
    runtime = request.runtime
    out = []
    for model, verdict in rows:
        row = {k: v for k, v in model.row().items() if k != "quant_group_size"}
        if runtime.router is not None:  # router mode: each model's own status
            status = runtime.model_status(model.repo_id)
            row.update(serving=bool(status and status["value"] == "loaded"), status=status)
        else:
            row["serving"] = served is not None and (model.path.resolve() == served.path.resolve()
                                                     or model.repo_id == served.model_id)
        out.append({**row, "assessment": verdict})
    return JsonResponse({"models": out})


@require_GET
async def fit_view(request: HttpRequest) -> JsonResponse:
    loaded = _served(request)
    if loaded is None:
        return surfaces.of(request).response(503, "no model is loaded in this process", "no_model_loaded",
                                             "engine_unavailable")
    return JsonResponse(await sync_to_async(fit_body)(loaded))


def fit_body(loaded) -> dict:
    from hub.models import DecodeMeasurement

    machine = library.this_machine()
    on_disk = registry.describe(loaded.model_id, loaded.path, "")
    report = fit.assess(loaded.weights_bytes, loaded.kv_bytes_per_token, machine.usable_bytes,
                        machine.decode_bandwidth_gbs, loaded.context_window)
    typical = min(fit.TYPICAL_CONTEXT, report["max_safe_context"])
    at_typical = fit.assess(loaded.weights_bytes, loaded.kv_bytes_per_token, machine.usable_bytes,
                            machine.decode_bandwidth_gbs, loaded.context_window, typical)
    measured = DecodeMeasurement.objects.filter(snapshot=str(loaded.path)).first()
    return {
        "machine": machine.row(), "model": loaded.model_id, "context_tokens": report["max_safe_context"],
        "typical_context_tokens": typical, "typical_decode_tps": at_typical["predicted_decode_tps"],
        "measured_decode_tps": round(measured.decode_tps, 2) if measured else None,
        "measured_at": int(measured.measured_at.timestamp() * 1000) if measured else None,
        "report": report, "context_window": loaded.context_window, "sku_matrix_ctx": fit.SKU_CONTEXT,
        "sku_matrix": fit.sku_matrix(on_disk.weights_bytes or loaded.weights_bytes, loaded.config,
                                     loaded.context_window),
    }


@require_GET
async def downloads_view(request: HttpRequest) -> JsonResponse:
    from hub.models import Download

    rows = await sync_to_async(lambda: [d.row() for d in Download.objects.all()[:5]])()
    return JsonResponse({"downloads": rows})
