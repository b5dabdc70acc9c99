"""`/api/jobs`, `/api/quantize`: submit, list, read, follow and cancel jobs."""
from __future__ import annotations

import asyncio
import importlib.util
import json

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from ninja import Router

from core.api import fail as _fail
from core.api import json_body as _body
from core.paths import (
    ADAPTER_FILES,
    PathRefused,
    confine,
    confine_members,
    confine_model_ref,
    holds_a_root,
    read_json,
    regular_entries,
)
from jobs import registry, service
from jobs.events import EventLog
from jobs.folders import stamped
from jobs.kinds import finetune, quantize
from jobs.models import Job

router = Router(tags=["jobs"])
STREAM_POLL_S = 0.3
KEEPALIVE_S = 10.0


def _model_body(request: HttpRequest) -> dict | JsonResponse:
    """A JSON object with a `model_id` string, or the 400 that says what is wrong."""
    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    if not isinstance(body.get("model_id"), str) or not body["model_id"]:
        return _fail("model_id required")
    try:
        confine_model_ref(body["model_id"], "model_id")
    except PathRefused as exc:
        return _fail(str(exc))
    return body


@router.get("/jobs")
def list_jobs(request: HttpRequest, limit: int = 50, kind: str | None = None):
    if kind is not None and kind not in registry.names():
        return _fail(f"kind must be one of {', '.join(registry.names())}")
    rows = Job.objects.all()
    if kind:
        rows = rows.filter(kind=kind)
    return {"ok": True, "jobs": [j.row() for j in rows[: max(1, min(limit, 500))]]}


@router.get("/jobs/{job_id}")
def get_job(request: HttpRequest, job_id: str):
    job = Job.objects.filter(id=job_id).first()
    return {"ok": True, "job": job.row()} if job else _fail("job not found", 404)


@router.post("/jobs/{job_id}/cancel")
def cancel_job(request: HttpRequest, job_id: str):
    job = Job.objects.filter(id=job_id).first()
    if job is None:
        return _fail("job not found", 404)
    if not service.cancel(job):
        return _fail(f"job is already {job.status}", 409)
    return {"ok": True, "job": Job.objects.get(id=job_id).row()}


def _frame(event: dict) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


async def job_events(job_id: str):
    """A job's events as they are written, until it has ended; None now and
    then while it is quiet (for a keep-alive), and a `failed` event for a
    job that does not exist."""
    job = await sync_to_async(Job.objects.filter(id=job_id).first)()
    if job is None:
        yield {"type": "failed", "error": "job not found"}
        return
    log, offset, quiet = EventLog(job.log_path), 0, 0.0
    while True:
        # Ended means the worker recorded the end (a cancel sets the status first, then the worker finishes).
        status, ended = await sync_to_async(lambda: Job.objects.filter(id=job_id).values_list(
            "status", "ended_at").first() or (None, None))()
        events, offset = await asyncio.to_thread(log.read, offset)
        for event in events:
            yield event
        quiet = 0.0 if events else quiet + STREAM_POLL_S
        if quiet >= KEEPALIVE_S:  # a queued or quiet job: keep proxies and clients from timing out
            quiet = 0.0
            yield None
        if status is None or (status in Job.TERMINAL and ended is not None):
            events, offset = await asyncio.to_thread(log.read, offset)  # what was written as it ended
            for event in events:
                yield event
            return
        await asyncio.sleep(STREAM_POLL_S)


async def _follow(job_id: str):
    yield b"retry: 1500\n\n"
    async for event in job_events(job_id):
        yield b": keep-alive\n\n" if event is None else _frame(event)
    yield b"event: end\ndata: {}\n\n"


@router.get("/jobs/{job_id}/stream")
async def stream_job(request: HttpRequest, job_id: str):
    return StreamingHttpResponse(_follow(job_id), content_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/quantize/inspect")
def quantize_inspect(request: HttpRequest):
    from inference.engine.errors import ModelNotFound
    from inference.engine.loader import resolve

    body = _model_body(request)
    if isinstance(body, JsonResponse):
        return body
    model_id = body["model_id"]
    try:
        _, path = resolve(model_id)
    except ModelNotFound as exc:
        return {"ok": False, "model_id": model_id, "error": str(exc)}
    try:
        confine_members(path, ["config.json"], "model_id")
        config = read_json(path / "config.json", "model_id")
        if not isinstance(config, dict):
            raise ValueError("config.json is not a JSON object")
        size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    except PathRefused as exc:
        return _fail(str(exc))
    except (OSError, ValueError) as exc:
        return {"ok": False, "model_id": model_id, "error": f"unreadable model: {exc}"}
    arch = config.get("model_type")
    support = False
    if isinstance(arch, str) and arch.replace("_", "").isalnum():
        from mlx_lm.utils import MODEL_REMAPPING

        support = importlib.util.find_spec(f"mlx_lm.models.{MODEL_REMAPPING.get(arch, arch)}") is not None
    out = {"ok": True, "model_id": model_id, "arch": arch, "support": support, "size_gb": round(size / 1e9, 3),
           "quantized": bool(config.get("quantization"))}
    return out


@router.post("/quantize/submit")
def quantize_submit(request: HttpRequest):
    from inference.engine.errors import ModelNotFound
    from inference.engine.loader import resolve

    body = _model_body(request)
    if isinstance(body, JsonResponse):
        return body
    model_id = body["model_id"]
    try:
        quantize.check(body)
        _, path = resolve(model_id)
        regular_entries(path, "model_id")  # the converter opens every file it knows by name
    except (ValueError, ModelNotFound) as exc:  # PathRefused included
        return _fail(str(exc))
    job = service.submit("quantize", body)
    repo = quantize.output_repo(model_id, path, body.get("bits", 4), body.get("target_bpw"))
    return {"ok": True, "job_id": job.id, "output_repo": repo}


@router.post("/finetune/inspect-dataset")
def finetune_inspect(request: HttpRequest):
    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    path = body.get("path")
    if not isinstance(path, str) or not path:
        return _fail("path required")
    try:
        return finetune.inspect(str(confine(path, "path")))
    except PathRefused as exc:
        return _fail(str(exc))


@router.post("/finetune/submit")
def finetune_submit(request: HttpRequest):
    from django.conf import settings

    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    if not isinstance(body.get("model_dir"), str) or not isinstance(body.get("data_dir"), str) \
            or not body["model_dir"] or not body["data_dir"]:
        return _fail("model_dir and data_dir required")
    if body.get("adapter_path") is not None and not isinstance(body["adapter_path"], str):
        return _fail("adapter_path must be a string")
    if not body.get("adapter_path"):
        body["adapter_path"] = str(stamped(settings.HEARTH_HOME / "adapters", "adapter"))
    try:
        finetune.confine_paths(body)
    except PathRefused as exc:
        return _fail(str(exc))
    job = service.submit("finetune", body)  # config errors surface as the job's failed event
    return {"ok": True, "job_id": job.id, "adapter_path": body["adapter_path"]}


@router.post("/finetune/merge")
def finetune_merge(request: HttpRequest):
    from django.conf import settings

    from jobs.adapters import register
    from jobs.merge import merge

    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    first, second, scales = body.get("adapter_a"), body.get("adapter_b"), body.get("scales")
    if not isinstance(first, str) or not first or not isinstance(second, str) or not second:
        return _fail("adapter_a and adapter_b required")
    if scales is not None and (not isinstance(scales, list) or len(scales) != 2 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in scales)):
        return _fail("scales must be a list of two numbers")
    out = stamped(settings.HEARTH_HOME / "adapters", "merged")
    try:
        stats = merge(first, second, out, [float(x) for x in scales] if scales else None)
    except (ValueError, OSError) as exc:
        return _fail(f"merge failed: {exc}")
    register(out)
    return {"ok": True, "merged_path": str(out), "stats": stats}


@router.post("/quantize/resolve-folder")
def quantize_resolve_folder(request: HttpRequest):
    return _resolve_folder(request)


@router.post("/model/resolve-folder")
def model_resolve_folder(request: HttpRequest):
    return _resolve_folder(request)


def _resolve_folder(request: HttpRequest):
    from pathlib import Path

    from huggingface_hub import constants

    from jobs.folders import resolve_folder

    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    try:
        return resolve_folder(Path(constants.HF_HUB_CACHE), body.get("folder_name"), body.get("rel_path"))
    except PathRefused as exc:
        return _fail(str(exc))


@router.post("/finetune/export")
def finetune_export(request: HttpRequest):
    import time as _time

    from django.conf import settings

    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    base, adapter = body.get("base_model"), body.get("adapter_path")
    if not isinstance(base, str) or not base or not isinstance(adapter, str) or not adapter:
        return _fail("base_model and adapter_path required")
    try:
        adapter_dir = confine(adapter, "adapter_path")
        confine_members(adapter_dir, ADAPTER_FILES, "adapter_path")
    except PathRefused as exc:
        return _fail(str(exc))
    if holds_a_root(adapter_dir) or not (adapter_dir / "adapters.safetensors").is_file():
        return _fail(f"{adapter_dir} holds no adapters.safetensors")
    out = stamped(settings.HEARTH_HOME / "exports", "export")
    out.mkdir(parents=True)
    manifest = {"version": 1, "base_model": base, "adapter_path": str(adapter_dir),
                "created_at": _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime())}
    if isinstance(body.get("method"), str):
        manifest["method"] = body["method"]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return {"ok": True, "export_path": str(out), "manifest": manifest}
