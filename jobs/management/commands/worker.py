"""`hearth worker`: one job-queue consumer. Marks jobs whose worker died as
zombie, then runs Huey's consumer until SIGINT/SIGTERM.

A worker that `hearth serve` started is tied to it (`core.procs.spawn`,
read by the CLI before any command runs) and stops (SIGTERM) when that
process goes: the parent-death signal on Linux, a parent watch on every
platform. A worker started by hand is tied to nothing and runs until it is
stopped.

On Redis (HEARTH_REDIS_URL) any number of workers, on any hosts, drain one
queue; each keeps a heartbeat and sweeps for jobs whose worker died
(jobs/presence.py)."""
from __future__ import annotations

import logging

from django.core.management import call_command
from django.core.management.base import BaseCommand

log = logging.getLogger("hearth.jobs")


class Command(BaseCommand):
    help = "Run a job worker on its own (`hearth serve` starts one itself)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--workers", type=int, default=2, help="jobs that may run at once")

    def handle(self, *args, **opts):
        from core.procs import spawner

        if spawner is not None:
            log.info("job worker tied to its server (pid %s)", spawner)
        from django.utils.module_loading import autodiscover_modules
        from huey.contrib.djhuey import HUEY

        from jobs import presence
        from jobs.runner import mark_zombies

        autodiscover_modules("tasks")  # register every app's tasks with this consumer

        call_command("migrate", interactive=False, verbosity=0)
        zombies = mark_zombies()
        if zombies:
            log.warning("marked %d orphaned running job(s) as zombie", zombies)
        self._requeue_lost(HUEY)
        consumer = HUEY.create_consumer(workers=opts["workers"], worker_type="thread", periodic=False,
                                        check_worker_health=True)
        if presence.enabled():  # other hosts' workers judge this one's jobs by its heartbeat
            presence.ensure_heartbeat()
        log.info("job worker ready (%d slots, queue %s%s)", opts["workers"], type(HUEY).__name__,
                 f", worker {presence.me()}" if presence.enabled() else "")
        try:
            consumer.run()
        finally:
            if presence.enabled():
                presence.stop_heartbeat()

    @staticmethod
    def _requeue_lost(huey) -> None:
        """Queued rows whose queue entry is gone (a consumer that failed to
        read it, a wiped queue file) are queued again."""
        from jobs.models import Job
        from jobs.tasks import run_job

        waiting = {task.args[0] for task in huey.pending() if task.name.endswith("run_job") and task.args}
        for job in Job.objects.filter(status="queued"):
            if job.id not in waiting:
                log.warning("job %s had lost its queue entry; queueing it again", job.id)
                run_job(job.id)
