"""Starting a synthesis job and recording how it ended (the Django side;
the work runs in the job's child, `memory.synthesis.pipeline`)."""
from __future__ import annotations

import hashlib
import json
import logging
import uuid
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from chat import store
from chat.models import ChatSession
from core import home
from jobs import service as jobs
from jobs.models import Job
from memory.models import MemoryVault, SynthesisRun
from memory.vault import VaultError

log = logging.getLogger("hearth.memory")


def _transcripts(since, until) -> list[dict]:
    """The showing path of every chat session changed in (since, until]."""
    sessions = ChatSession.objects.filter(updated_at__lte=until).order_by("updated_at")
    if since is not None:
        sessions = sessions.filter(updated_at__gt=since)
    out = []
    for session in sessions:
        messages = [{"role": e.role, "content": e.content} for e in store.path(session)
                    if e.role in ("user", "assistant") and e.content.strip()]
        if messages:
            out.append({"id": session.id, "title": session.title, "updatedAt": session.updated_at.isoformat(),
                        "messages": messages})
    return out


def start(row: MemoryVault, dry: bool, api_url: str | None, model_name: str | None = None) -> SynthesisRun:
    busy = SynthesisRun.objects.filter(vault=row, job__status__in=("queued", "running")).first()
    if busy is not None:
        raise VaultError(f"a synthesis of {row.name!r} is already {busy.job.status} (job {busy.job_id})", 409)
    if not dry and not api_url:
        raise VaultError("synthesis needs the served model: run it from a running `hearth serve`")
    until = timezone.now()
    sessions = _transcripts(row.last_synthesized_at, until)
    folder = home.job_logs()
    folder.mkdir(parents=True, exist_ok=True)
    sessions_file = folder / f"synthesis-{uuid.uuid4().hex[:12]}.sessions.json"
    sessions_file.write_text(json.dumps(sessions, ensure_ascii=False), encoding="utf-8")
    vault_key = hashlib.sha256(row.root.encode()).hexdigest()[:12]
    scratch = home.scratch() / "synthesis" / vault_key
    with transaction.atomic():
        job = jobs.submit("synthesis", {"vault": row.name, "vault_root": row.root, "dry": dry,
                                        "sessions_file": str(sessions_file), "scratch_root": str(scratch / "trees"),
                                        "key": sessions_file.stem, "api_url": api_url, "model_name": model_name})
        return SynthesisRun.objects.create(vault=row, job=job, dry=dry, since=row.last_synthesized_at, until=until,
                                           session_count=len(sessions))


def _covered(job: Job, run: SynthesisRun):
    """How far the run read: `until`, or the last session it read whole when
    its cap left some for the next run."""
    from django.utils.dateparse import parse_datetime

    try:
        summary = json.loads(job.message or "{}")
    except ValueError:
        summary = {}
    # Stored summaries may carry the key under its camel-case name, coveredUntil.
    until = summary.get("covered_until") or summary.get("coveredUntil")
    covered = parse_datetime(until) if until else None
    if summary.get("sessions", 0) and covered is not None and covered < run.until:
        return covered
    return run.until


def finished(job: Job) -> None:
    """Called by the worker when a synthesis job ends, however it ended."""
    run = SynthesisRun.objects.filter(job=job).select_related("vault").first()
    if run is None:
        return
    events, _ = job.event_log().read()
    run.commits_json = json.dumps([{"stage": e.get("stage"), "hash": e.get("hash")}
                                   for e in events if e.get("type") == "commit"])
    run.save(update_fields=["commits_json"])
    if job.status == "done" and not run.dry:  # sessions read are in; the next run starts after them
        MemoryVault.objects.filter(id=run.vault_id).update(last_synthesized_at=_covered(job, run))
    config = json.loads(job.config_json or "{}")
    if config.get("sessions_file"):
        Path(config["sessions_file"]).unlink(missing_ok=True)
    if job.status != "done" and not run.dry and config.get("scratch_root"):
        _clear_scratch(job, config)


def _clear_scratch(job: Job, config: dict) -> None:
    """A run killed part way (its worker or server died) left its scratch
    worktree registered in the vault; remove it now rather than at the next run."""
    from memory.synthesis.scratch import clear_abandoned

    try:
        clear_abandoned(Path(config["vault_root"]), Path(config["scratch_root"]))
    except Exception as exc:  # the next run clears it too; the job's end is recorded regardless
        log.warning("job %s: could not clear its scratch worktree: %s", job.id, exc)
