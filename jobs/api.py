"""`/api/jobs`, `/api/quantize`: submit, list, read, follow and cancel jobs."""
from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import cast

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from ninja import Query

from core import home, sse
from core.api import ApiError, refused
from core.openapi import NO_BODY
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
from core.surfaces import API
from jobs import registry, service
from jobs.api_bodies import (
    DatasetFolder,
    ExportRequest,
    FinetunePaths,
    FinetuneRequest,
    MergeRequest,
    ModelRef,
    PickedFolder,
    QuantizeRequest,
)
from jobs.folders import stamped
from jobs.kinds import finetune, quantize
from jobs.models import Job

router = API.router(tags=["jobs"])
NOTHING_PICKED = PickedFolder()  # what an empty body means
STREAM_POLL_S = 0.3
KEEPALIVE_S = 10.0


def _confined_model(model_id: str) -> str:
    """`model_id`, a repo id or a folder inside the allowed roots (ApiError otherwise)."""
    with refused(PathRefused):
        confine_model_ref(model_id, "model_id")
    return model_id


def _job(job_id: str) -> Job:
    job = Job.objects.filter(id=job_id).first()
    if job is None:
        raise ApiError("job not found", 404)
    return job


@router.get("/jobs")
def list_jobs(request: HttpRequest, limit: int = Query(50, description="1 to 500"),
              kind: str | None = Query(None, description="quantize, finetune, dataset, synthesis...")) -> dict:
    if kind is not None and kind not in registry.names():
        raise ApiError(f"kind must be one of {', '.join(registry.names())}")
    rows = Job.objects.brief()
    if kind:
        rows = rows.filter(kind=kind)
    return {"ok": True, "jobs": [j.row() for j in rows[: max(1, min(limit, 500))]]}


@router.get("/jobs/{job_id}")
def get_job(request: HttpRequest, job_id: str) -> dict:
    return {"ok": True, "job": _job(job_id).row()}


@router.get("/lineage")
def lineage(request: HttpRequest) -> dict:
    """The library's lineage (jobs/lineage.py): base model -> dataset -> fine-tune job -> adapter -> merged,
    exported or quantized model -> served, as `{nodes, edges}`; each node has the dashboard page it links to."""
    from hub import library
    from jobs.lineage import build

    # The library's listing as the Models page reads it: kept until the cache changes (the page polls).
    return {"ok": True, **build([m.repo_id for m, _ in library.models()], request.runtime.loaded_models())}


@router.post("/jobs/{job_id}/cancel", openapi_extra=NO_BODY)
def cancel_job(request: HttpRequest, job_id: str) -> dict:
    job = _job(job_id)
    if not service.cancel(job):
        raise ApiError(f"job is already {job.status}", 409)
    return {"ok": True, "job": Job.objects.get(id=job_id).row()}


async def job_events(job_id: str):
    """A job's events as they are written, until it has ended; None now and
    then while it is quiet (for a keep-alive), and a `failed` event for a
    job that does not exist."""
    job = await sync_to_async(Job.objects.filter(id=job_id).first)()
    if job is None:
        yield {"type": "failed", "error": "job not found"}
        return
    log, offset, quiet = job.event_log(), 0, 0.0
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
        yield sse.KEEP_ALIVE if event is None else sse.frame(event)
    yield sse.frame({}, "end")


@router.get("/jobs/{job_id}/stream")
async def stream_job(request: HttpRequest, job_id: str):
    return API.sse(_follow(job_id))


@router.post("/quantize/inspect")
def quantize_inspect(request: HttpRequest, body: ModelRef) -> dict:
    """What the model is and whether mlx-lm can quantize it: 404 (with its `model_id`) when there is no
    such model, 422 when it cannot be read."""
    from inference.engine.errors import ModelNotFound
    from inference.engine.loader import resolve

    model_id = _confined_model(body.model_id)
    try:
        _, path = resolve(model_id)
    except ModelNotFound as exc:
        raise ApiError(str(exc), 404, model_id=model_id) from None
    try:
        with refused(PathRefused):
            confine_members(path, ["config.json"], "model_id")
            config = read_json(path / "config.json", "model_id")
        if not isinstance(config, dict):
            raise ValueError("config.json is not a JSON object")
        size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    except (OSError, ValueError) as exc:
        raise ApiError(f"unreadable model: {exc}", 422, model_id=model_id) from None
    arch = config.get("model_type")
    support = False
    if isinstance(arch, str) and arch.replace("_", "").isalnum():
        from mlx_lm.utils import MODEL_REMAPPING

        support = importlib.util.find_spec(f"mlx_lm.models.{MODEL_REMAPPING.get(arch, arch)}") is not None
    return {"ok": True, "model_id": model_id, "arch": arch, "support": support, "size_gb": round(size / 1e9, 3),
            "quantized": bool(config.get("quantization"))}


@router.post("/quantize/submit")
def quantize_submit(request: HttpRequest, body: QuantizeRequest) -> dict:
    from huggingface_hub import constants

    from inference.engine.errors import ModelNotFound
    from inference.engine.loader import resolve

    model_id = _confined_model(body.model_id)
    config = body.model_dump(exclude_unset=True)  # the job applies its own defaults to what was left out
    with refused(ValueError, ModelNotFound):  # PathRefused included
        quantize.check(config)
        quantize.check_calibration(config)
        _, path = resolve(model_id)
        regular_entries(path, "model_id")  # the converter opens every file it knows by name
    job = service.submit("quantize", config)
    repo = quantize.output_repo(model_id, path, body.bits, body.target_bpw, body.method)
    folder = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))  # where the job publishes it
    return {"ok": True, "job_id": job.id, "output_dir": str(folder), "output_repo": repo}


@router.post("/finetune/inspect-dataset")
async def finetune_inspect(request: HttpRequest, body: DatasetFolder) -> dict:
    """What the folder's `train.jsonl` (and `valid.jsonl`) hold: 404 when there is no `train.jsonl`,
    422 when the rows cannot be read."""
    # PathRefused is a ValueError: the innermost refusal answers it first, with its 400.
    with refused(FileNotFoundError, status=404), refused(ValueError, status=422), refused(PathRefused):
        # A pass over every row of a large file takes seconds: in a thread of its own, not on the one
        # thread Django's synchronous views share.
        return await asyncio.to_thread(lambda: finetune.inspect(str(confine(body.path, "path"))))


@router.post("/finetune/submit")
def finetune_submit(request: HttpRequest, body: FinetuneRequest) -> dict:  # type: ignore[valid-type]
    # FinetuneRequest is built from the trainer's Options at import; to a type checker it is a FinetunePaths
    config = cast(FinetunePaths, body).model_dump(exclude_unset=True)  # the trainer's defaults fill the rest
    if not config.get("adapter_path"):
        config["adapter_path"] = str(stamped(home.adapters(), "adapter"))
    with refused(ValueError):  # PathRefused included: a 400 now, not a job that fails once it starts
        finetune.confine_paths(config)
        finetune.settings(config)
    job = service.submit("finetune", config)  # what only the run can tell (the rows, the model) fails the job
    return {"ok": True, "job_id": job.id, "adapter_path": config["adapter_path"]}


@router.post("/finetune/merge")
def finetune_merge(request: HttpRequest, body: MergeRequest) -> dict:
    from jobs.adapters import register
    from jobs.merge import merge

    out = stamped(home.adapters(), "merged")
    try:
        stats = merge(body.adapter_a, body.adapter_b, out, body.scales)
    except (ValueError, OSError) as exc:
        raise ApiError(f"merge failed: {exc}") from None
    register(out)
    return {"ok": True, "merged_path": str(out), "stats": stats}


@router.post("/quantize/resolve-folder")
def quantize_resolve_folder(request: HttpRequest, body: PickedFolder = NOTHING_PICKED) -> dict:
    return _resolve_folder(body)


@router.post("/model/resolve-folder")
def model_resolve_folder(request: HttpRequest, body: PickedFolder = NOTHING_PICKED) -> dict:
    return _resolve_folder(body)


def _resolve_folder(body: PickedFolder) -> dict:
    """The model a picked folder names; 404 when it names none this server can find."""
    from pathlib import Path

    from huggingface_hub import constants

    from jobs.folders import FolderNotFound, resolve_folder

    with refused(PathRefused), refused(FolderNotFound, status=404):
        return resolve_folder(Path(constants.HF_HUB_CACHE), body.folder_name, body.rel_path)


@router.post("/finetune/export")
def finetune_export(request: HttpRequest, body: ExportRequest) -> dict:
    import time as _time

    with refused(PathRefused):
        adapter_dir = confine(body.adapter_path, "adapter_path")
        confine_members(adapter_dir, ADAPTER_FILES, "adapter_path")
    if holds_a_root(adapter_dir) or not (adapter_dir / "adapters.safetensors").is_file():
        raise ApiError(f"{adapter_dir} holds no adapters.safetensors")
    out = stamped(home.exports(), "export")
    out.mkdir(parents=True)
    manifest = {"version": 1, "base_model": body.base_model, "adapter_path": str(adapter_dir),
                "created_at": _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime())}
    if body.method is not None:
        manifest["method"] = body.method
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return {"ok": True, "export_path": str(out), "manifest": manifest}
