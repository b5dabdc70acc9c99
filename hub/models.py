"""Downloads and decode measurements, kept in SQLite."""
from __future__ import annotations

from django.db import models


class Download(models.Model):
    STATES = [(s, s) for s in ("queued", "active", "done", "error")]

    repo_id = models.CharField(max_length=256, db_index=True)
    revision = models.CharField(max_length=128, default="main")  # what was asked for
    commit = models.CharField(max_length=64, null=True, blank=True)  # what it resolved to
    state = models.CharField(max_length=16, choices=STATES, default="queued", db_index=True)
    current_file = models.CharField(max_length=4096, null=True, blank=True)
    received_bytes = models.BigIntegerField(default=0)
    total_bytes = models.BigIntegerField(default=0)
    files_done = models.IntegerField(default=0)
    files_total = models.IntegerField(default=0)
    bytes_per_sec = models.FloatField(default=0.0)  # rolling ~5 s window
    owner_pid = models.IntegerField(null=True, blank=True)  # the process downloading it
    error = models.TextField(null=True, blank=True)  # what a person reads (hub/reach.py)
    detail = models.TextField(null=True, blank=True)  # the exception behind it, shown under it
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"{self.repo_id} ({self.state})"

    def row(self) -> dict:
        out = {"repo_id": self.repo_id, "state": "active" if self.state == "queued" else self.state,
               "current_file": self.current_file, "received_bytes": self.received_bytes,
               "total_bytes": self.total_bytes, "files_done": self.files_done, "files_total": self.files_total,
               "bytes_per_sec": round(self.bytes_per_sec), "started_at": int(self.started_at.timestamp()),
               "finished_at": int(self.finished_at.timestamp()) if self.finished_at else None}
        if self.state == "error":
            out["error"] = self.error
            if self.detail:
                out["detail"] = self.detail
        return out


class DecodeMeasurement(models.Model):
    """A measured decode rate of one model snapshot on this machine."""

    repo_id = models.CharField(max_length=256, db_index=True)
    snapshot = models.CharField(max_length=4096)  # the snapshot directory measured
    decode_tps = models.FloatField()
    tokens = models.IntegerField()
    lane = models.CharField(max_length=16, default="serial")
    measured_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-measured_at"]

    def __str__(self) -> str:
        return f"{self.repo_id}: {self.decode_tps:.1f} tok/s"
