"""`/api/dataset/*`: the dataset-builder templates and their jobs."""
from __future__ import annotations

from django.http import HttpRequest

from core import home
from core.api import ApiError, refused
from core.surfaces import API
from jobs import service
from jobs.api_bodies import DatasetRequest
from jobs.folders import stamped
from jobs.kinds import dataset

router = API.router(tags=["dataset"])


@router.get("/dataset/templates")
def templates(request: HttpRequest) -> dict:
    return {"ok": True, "templates": dataset.TEMPLATES}


@router.post("/dataset/submit")
def submit(request: HttpRequest, body: DatasetRequest) -> dict:
    runtime = request.runtime
    template = dataset.BY_ID.get(body.template_id)
    if template is None:
        raise ApiError(f"unknown template {body.template_id!r}; see GET /api/dataset/templates")
    with refused(ValueError):  # PathRefused included
        dataset.check_inputs(template, body.inputs)
    model = runtime.job_model(body.model_name) if template["needs_llm"] or body.inputs.get("model_rejects") \
        else body.model_name
    out = stamped(home.datasets(), f"dataset-{template['id']}")
    api_url = runtime.local_url or f"{request.scheme}://{request.get_host()}"
    job = service.submit("dataset", {"template_id": template["id"], "inputs": body.inputs,
                                     "model_name": model, "output_dir": str(out), "api_url": api_url})
    return {"ok": True, "job_id": job.id, "output_dir": str(out)}
