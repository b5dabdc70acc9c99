"""Huey tasks. The worker thread only supervises; the work runs in a child."""
from huey.contrib.djhuey import db_task

from jobs import runner


@db_task()
def run_job(job_id: str) -> None:
    runner.run(job_id)
