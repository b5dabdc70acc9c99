"""Memory vaults: where each one lives, which is the default, and its synthesis runs."""
from __future__ import annotations

from django.db import models


class MemoryVault(models.Model):
    name = models.CharField(max_length=64, unique=True)
    root = models.CharField(max_length=4096, unique=True)
    is_default = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_synthesized_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-is_default", "name"]

    def __str__(self) -> str:
        return self.name

    def row(self) -> dict:
        return {"name": self.name, "root": self.root, "default": self.is_default,
                "created_at": self.created_at.isoformat(),
                "last_synthesized_at": self.last_synthesized_at.isoformat() if self.last_synthesized_at else None}


class SynthesisRun(models.Model):
    """One synthesis job over a vault: which sessions it read and what it committed."""

    vault = models.ForeignKey(MemoryVault, on_delete=models.CASCADE, related_name="runs")
    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="synthesis")
    dry = models.BooleanField(default=False)
    since = models.DateTimeField(null=True, blank=True)  # sessions updated after this were read
    until = models.DateTimeField()  # ... and up to this
    session_count = models.IntegerField(default=0)
    commits_json = models.TextField(default="[]")  # [{"stage", "hash"}] that reached the vault
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.vault.name} {self.job_id}"
