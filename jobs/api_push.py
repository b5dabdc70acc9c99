"""`/api/{quantize,finetune,dataset}/push` and `/api/settings/hf-token`."""
from __future__ import annotations

from pathlib import Path

from django.http import HttpRequest

from core.api import ApiError, refused
from core.openapi import NO_BODY
from core.paths import PathRefused, confine, holds_a_root
from core.surfaces import API
from hub import hf
from jobs.api_bodies import PushRequest, TokenRequest
from jobs.models import Job

router = API.router(tags=["push"])


@router.get("/settings/hf-token")
def token_status(request: HttpRequest) -> dict:
    return {"ok": True, "has_token": hf.saved_token() is not None}


@router.post("/settings/hf-token")
def token_save(request: HttpRequest, body: TokenRequest) -> dict:
    token = body.token.strip()
    if not token:
        raise ApiError("token: a token is required")
    if len(token) > hf.TOKEN_MAX or not token.isascii() or not token.isprintable() or " " in token:
        raise ApiError(f"token: a Hugging Face token is one word of at most {hf.TOKEN_MAX} ASCII characters "
                       f"(hf_ and about 34 letters); this is {len(token)} characters")
    hf.save_token(token)
    return {"ok": True}


@router.delete("/settings/hf-token", openapi_extra=NO_BODY)
def token_forget(request: HttpRequest) -> dict:
    return {"ok": True, "removed": hf.forget_token()}


def _folder(body: PushRequest, kind: str) -> Path:
    """The folder a push sends: `source_path`, or the output of a finished `job_id` of this kind."""
    job_id, source = body.job_id, body.source_path
    if source:
        with refused(PathRefused):
            folder = confine(source, "source_path")
    elif job_id:
        job = Job.objects.filter(id=job_id, kind=kind).first()
        if job is None:
            raise ApiError(f"no {kind} job {job_id}")
        if job.status != "done" or not job.output_path:
            raise ApiError(f"{kind} job {job_id} has no output (status {job.status})")
        folder = Path(job.output_path)
    else:
        raise ApiError("source_path or job_id required")
    if not folder.is_dir():
        raise ApiError(f"{folder} is not a directory")
    if holds_a_root(folder.resolve()):
        raise ApiError("source_path must be the artifact's own folder, not HEARTH_HOME, the cache or a folder "
                       "above them")
    return folder


def _push(body: PushRequest, kind: str, repo_type: str) -> dict:
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if hf.saved_token() is None:
        raise ApiError("no Hugging Face token saved; POST /api/settings/hf-token first")
    repo_id, private = body.repo_id, body.private  # private unless the request says otherwise
    folder = _folder(body, kind)
    files = hf.artifact_files(folder, kind)
    if not files:
        raise ApiError(f"{folder} holds no {kind} files to push ({hf.describe_files(kind)})")
    try:
        url = hf.push(folder, files, repo_id, repo_type, private)
    except OfflineModeIsEnabled:
        raise ApiError("upload failed: HF_HUB_OFFLINE is set, so nothing can reach the Hub") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ApiError(f"upload failed: {exc}") from None
    except Exception as exc:  # network errors come from the HTTP client, not huggingface_hub
        raise ApiError(f"upload failed: {type(exc).__name__}: {exc}") from None
    return {"ok": True, "url": url}


@router.post("/quantize/push")
def quantize_push(request: HttpRequest, body: PushRequest) -> dict:
    return _push(body, "quantize", "model")


@router.post("/finetune/push")
def finetune_push(request: HttpRequest, body: PushRequest) -> dict:
    return _push(body, "finetune", "model")


@router.post("/dataset/push")
def dataset_push(request: HttpRequest, body: PushRequest) -> dict:
    return _push(body, "dataset", "dataset")
