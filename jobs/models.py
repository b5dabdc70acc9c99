"""A job is a database row plus an event log (an NDJSON file, or a Redis stream: jobs/events.py)."""
from __future__ import annotations

import uuid

from django.db import models


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

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"

    def event_log(self):
        """Its events: the NDJSON file at `log_path`, or a Redis stream when Hearth runs on Redis."""
        from django.conf import settings

        from jobs.events import open_log

        return open_log(self.log_path, settings.HEARTH_REDIS_URL)

    def row(self) -> dict:
        def iso(value):
            return value.isoformat() if value else None

        return {"id": self.id, "kind": self.kind, "status": self.status, "config_json": self.config_json,
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
