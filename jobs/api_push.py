"""`/api/{quantize,finetune,dataset}/push` and `/api/settings/hf-token`."""
from __future__ import annotations

import re
from pathlib import Path

from django.http import HttpRequest, JsonResponse
from ninja import Router

from core.api import fail, json_body
from core.paths import PathRefused, confine, holds_a_root
from hub import hf
from jobs.models import Job

router = Router(tags=["push"])
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@router.get("/settings/hf-token")
def token_status(request: HttpRequest):
    return {"ok": True, "hasToken": hf.saved_token() is not None}


@router.post("/settings/hf-token")
def token_save(request: HttpRequest):
    body = json_body(request)
    if isinstance(body, JsonResponse):
        return body
    token = body.get("token")
    if not isinstance(token, str) or not token.strip():
        return fail("token required")
    hf.save_token(token.strip())
    return {"ok": True}


@router.delete("/settings/hf-token")
def token_forget(request: HttpRequest):
    return {"ok": True, "removed": hf.forget_token()}


def _push(request: HttpRequest, kind: str, repo_type: str):
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    body = json_body(request)
    if isinstance(body, JsonResponse):
        return body
    repo_id, job_id, source = body.get("repo_id"), body.get("job_id"), body.get("source_path")
    if not isinstance(repo_id, str) or not REPO_ID.match(repo_id):
        return fail("repo_id required, as owner/name")
    if hf.saved_token() is None:
        return fail("no Hugging Face token saved; POST /api/settings/hf-token first")
    private = body.get("private", True)  # private unless the request says otherwise
    if not isinstance(private, bool):
        return fail("private must be true or false")
    if source is not None and not isinstance(source, str):
        return fail("source_path must be a string")
    if source:
        try:
            folder = confine(source, "source_path")
        except PathRefused as exc:
            return fail(str(exc))
    elif isinstance(job_id, str) and job_id:
        job = Job.objects.filter(id=job_id, kind=kind).first()
        if job is None:
            return fail(f"no {kind} job {job_id}")
        if job.status != "done" or not job.output_path:
            return fail(f"{kind} job {job_id} has no output (status {job.status})")
        folder = Path(job.output_path)
    else:
        return fail("source_path or job_id required")
    if not folder.is_dir():
        return fail(f"{folder} is not a directory")
    if holds_a_root(folder.resolve()):
        return fail("source_path must be the artifact's own folder, not HEARTH_HOME, the cache or a folder above them")
    files = hf.artifact_files(folder, kind)
    if not files:
        return fail(f"{folder} holds no {kind} files to push ({hf.describe_files(kind)})")
    try:
        url = hf.push(folder, files, repo_id, repo_type, private)
    except OfflineModeIsEnabled:
        return fail("upload failed: HF_HUB_OFFLINE is set, so nothing can reach the Hub")
    except (HfHubHTTPError, OSError, ValueError) as exc:
        return fail(f"upload failed: {exc}")
    except Exception as exc:  # network errors come from the HTTP client, not huggingface_hub
        return fail(f"upload failed: {type(exc).__name__}: {exc}")
    return {"ok": True, "url": url}


@router.post("/quantize/push")
def quantize_push(request: HttpRequest):
    return _push(request, "quantize", "model")


@router.post("/finetune/push")
def finetune_push(request: HttpRequest):
    return _push(request, "finetune", "model")


@router.post("/dataset/push")
def dataset_push(request: HttpRequest):
    return _push(request, "dataset", "dataset")
