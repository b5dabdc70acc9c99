"""`/api/dataset/*`: the dataset-builder templates and their jobs."""
from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from ninja import Router

from core.api import fail, json_body
from jobs import service
from jobs.folders import stamped
from jobs.kinds import dataset

router = Router(tags=["dataset"])


@router.get("/dataset/templates")
def templates(request: HttpRequest):
    return {"templates": dataset.TEMPLATES}


@router.post("/dataset/submit")
def submit(request: HttpRequest):
    runtime = request.runtime
    body = json_body(request)
    if isinstance(body, JsonResponse):
        return body
    template = dataset.BY_ID.get(body.get("template_id")) if isinstance(body.get("template_id"), str) else None
    if template is None:
        return fail(f"unknown template {body.get('template_id')!r}; see GET /api/dataset/templates")
    inputs = body.get("inputs", {})
    if not isinstance(inputs, dict):
        return fail("inputs must be an object")
    model_name = body.get("model_name")
    if model_name is not None and not isinstance(model_name, str):
        return fail("model_name must be a string")
    try:
        dataset.check_inputs(template, inputs)
    except ValueError as exc:
        return fail(str(exc))
    out = stamped(settings.HEARTH_HOME / "datasets", f"dataset-{template['id']}")
    api_url = runtime.local_url or f"{request.scheme}://{request.get_host()}"
    job = service.submit("dataset", {"template_id": template["id"], "inputs": inputs, "model_name": model_name,
                                     "output_dir": str(out), "api_url": api_url})
    return {"ok": True, "job_id": job.id, "output_dir": str(out)}
