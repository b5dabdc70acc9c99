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
    """Cancel a queued or running job; the worker kills its child."""
    updated = Job.objects.filter(id=job.id, status__in=("queued", "running")).update(status="cancelled")
    if updated and job.status == "queued":  # no worker will see it: end it here
        from django.utils import timezone

        from jobs.runner import after_end, emit_safely

        Job.objects.filter(id=job.id).update(ended_at=timezone.now(), error="cancelled by request")
        emit_safely(job, "failed", error="cancelled by request")
        after_end(Job.objects.get(id=job.id))
    return bool(updated)
