"""Creating jobs: a row, a log path, and a queue entry once the row commits."""
from __future__ import annotations

import json

from django.db import transaction

from core import home
from core.api import ApiError
from jobs.models import Job

# A job's settings are a row every listing of jobs passes over (SQLite reads a row's large values to
# reach the columns after them): text longer than this belongs in a file the job is given by path.
MAX_CONFIG = 1 << 20


def _bulk(config: dict) -> str:
    """Where most of `config`'s size lies: the path (`inputs.data`) of the value holding over
    half of it, as deep as one does."""
    where, value = "", config
    while isinstance(value, (dict, list)) and value:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        sizes = [(len(json.dumps(v)), k, v) for k, v in items]
        size, key, child = max(sizes, key=lambda s: s[0])
        if 2 * size < len(json.dumps(value)):
            break
        where, value = (f"{where}.{key}".lstrip(".") if isinstance(key, str) else f"{where}[{key}]"), child
    return where or "body"


def submit(kind: str, config: dict) -> Job:
    text = json.dumps(config)
    if len(text) > MAX_CONFIG:
        field = _bulk(config)
        raise ApiError(f"{field}: a job's settings are at most {MAX_CONFIG >> 20} MiB of JSON, these are "
                       f"{len(text) / (1 << 20):.1f} MiB; larger data goes in a file the job is given by path")
    logs = home.job_logs()
    logs.mkdir(parents=True, exist_ok=True)
    with transaction.atomic():
        job = Job(kind=kind, config_json=text)
        job.log_path = str(logs / f"{job.id}.ndjson")
        job.save()
        transaction.on_commit(lambda: _enqueue(job.id))
    return job


def _enqueue(job_id: str) -> None:
    from jobs.tasks import run_job

    run_job(job_id)


def cancel(job: Job) -> bool:
    """Cancel a queued or running job. A queued one ends here (no worker will
    start it: the worker starts only a job still queued); a running one is
    marked, and its worker kills the child and records the end."""
    from django.db import transaction
    from django.utils import timezone

    from jobs.runner import emit_safely, end

    with transaction.atomic():
        if Job.objects.filter(id=job.id, status="queued").update(status="cancelled"):
            ended = Job.objects.get(id=job.id)
            ended.ended_at, ended.error = timezone.now(), "cancelled by request"
            emit_safely(ended, "failed", error=ended.error)
            end(ended, ["ended_at", "error"])
            return True
    return bool(Job.objects.filter(id=job.id, status="running").update(status="cancelled"))
