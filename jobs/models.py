"""A job is a database row plus an event log (an NDJSON file, or a Redis stream: jobs/events.py)."""
from __future__ import annotations

import json
import uuid

from django.db import models
from django.db.models import Case, F, TextField, Value, When
from django.db.models.functions import Length

# Characters of a job's settings a listing carries (`Job.objects.brief()`): a dataset job's pasted rows
# may be as large as a request body (32 MiB), and the Jobs page polls the listing.
BRIEF_CONFIG = 64 * 1024


class JobQuerySet(models.QuerySet):
    def brief(self) -> "JobQuerySet":
        """The rows with settings over BRIEF_CONFIG characters left in the database (SQL picks
        the column or nothing): their `row()` says `{"elided": <characters>}` for `config_json`."""
        return self.defer("config_json").annotate(
            config_chars=Length("config_json"),
            config_brief=Case(When(config_chars__lte=BRIEF_CONFIG, then=F("config_json")),
                              default=Value(None), output_field=TextField()))


def _job_id() -> str:
    return uuid.uuid4().hex[:16]


class Job(models.Model):
    STATUSES = [(s, s) for s in ("queued", "running", "done", "failed", "cancelled", "zombie")]
    TERMINAL = ("done", "failed", "cancelled", "zombie")

    id = models.CharField(primary_key=True, max_length=32, default=_job_id, editable=False)
    kind = models.CharField(max_length=16)  # a registered kind (jobs/registry.py)
    status = models.CharField(max_length=16, choices=STATUSES, default="queued", db_index=True)
    config_json = models.TextField(default="{}")
    progress = models.FloatField(default=0.0)
    message = models.TextField(null=True, blank=True)
    log_path = models.CharField(max_length=4096)
    output_path = models.CharField(max_length=4096, null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    worker_pid = models.IntegerField(null=True, blank=True)  # the worker process running it
    worker_host = models.CharField(max_length=255, blank=True, default="")  # and its host (HEARTH_WORKER_HOST)
    child_pid = models.IntegerField(null=True, blank=True)  # the child doing the MLX work

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"

    def config_text(self) -> str:
        """Its settings as JSON; from `brief()`, `{"elided": <characters>}` for ones over BRIEF_CONFIG."""
        if not hasattr(self, "config_brief"):
            return self.config_json
        return self.config_brief if self.config_brief is not None else json.dumps({"elided": self.config_chars})

    def event_log(self):
        """Its events: the NDJSON file at `log_path`, or a Redis stream when Hearth runs on Redis."""
        from django.conf import settings

        from jobs.events import open_log

        return open_log(self.log_path, settings.HEARTH_REDIS_URL)

    def row(self) -> dict:
        def iso(value):
            return value.isoformat() if value else None

        return {"id": self.id, "kind": self.kind, "status": self.status, "config_json": self.config_text(),
                "progress": self.progress, "message": self.message, "log_path": self.log_path,
                "output_path": self.output_path, "error": self.error, "created_at": iso(self.created_at),
                "started_at": iso(self.started_at), "ended_at": iso(self.ended_at)}


class Adapter(models.Model):
    """A LoRA adapter on disk: written by a fine-tune job, or mounted by path."""

    name = models.CharField(max_length=255, db_index=True)  # the id it mounts under by default
    path = models.CharField(max_length=4096, unique=True)
    base_model = models.CharField(max_length=4096, null=True, blank=True)
    rank = models.IntegerField(null=True, blank=True)
    scale = models.FloatField(null=True, blank=True)
    method = models.CharField(max_length=64, null=True, blank=True)  # sft, dpo, orpo, merge
    size_bytes = models.BigIntegerField(default=0)
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="adapters")
    created_at = models.DateTimeField(auto_now_add=True)
    last_mounted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.path})"
