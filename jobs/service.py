"""Creating jobs: a row, a log path, and a queue entry once the row commits."""
from __future__ import annotations

import json

from django.db import transaction

from core import home
from jobs.models import Job


def submit(kind: str, config: dict) -> Job:
    logs = home.job_logs()
    logs.mkdir(parents=True, exist_ok=True)
    with transaction.atomic():
        job = Job(kind=kind, config_json=json.dumps(config))
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
