"""The worker side of a job: start the child, follow its event log into the
row (progress, message), honour a cancel, and record how it ended."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.procs import pid_alive, spawn, started_before
from jobs import presence, registry
from jobs.models import Job

log = logging.getLogger("hearth.jobs")
POLL_S = 0.25


def _worker_gone(job: Job) -> str | None:
    """Why the job's worker is gone; None while it lives. A live pid counts
    only if that process was already running when the job started: after a
    reboot or a long while the number may belong to another process, and the
    job would stay running forever. On Redis a worker on another host is
    judged by its heartbeat (jobs/presence.py)."""
    if presence.enabled():
        remote = presence.owner_gone(job.id)
        if remote is None and job.worker_host and job.worker_host != settings.HEARTH_WORKER_HOST:
            # No owner record (Redis lost it) for another host's job: its pid means nothing here.
            name = f"{job.worker_host}:{job.worker_pid}"
            remote = presence.worker_gone(name), name
        if remote is not None:
            gone, name = remote
            return f"its worker ({name}) stopped while it ran: no heartbeat" if gone else None
    if pid_alive(job.worker_pid) and (job.started_at is None
                                      or started_before(job.worker_pid, job.started_at.timestamp())):
        return None
    return f"its worker (pid {job.worker_pid}) stopped while it ran"


def _finished_on_disk(job: Job) -> dict | None:
    """The `done` its child wrote, when that is how its event log ends and
    the output it names is on disk: the job finished, and only its worker
    died before recording it (a quantize killed just after publishing)."""
    try:
        events, _ = job.event_log().read(0)
    except Exception:  # an unreadable log, or a Redis that is away: no evidence of an end
        return None
    last = next((e for e in reversed(events) if e.get("type") in ("done", "failed")), None)
    if last is None or last.get("type") != "done":
        return None
    output = last.get("output_dir")
    return last if not output or Path(output).exists() else None


def settings_file(job: Job) -> Path:
    """Where the worker writes a job's settings for its child: beside its log, not on the command line
    (Linux caps one argument at 128 KiB, which a dataset job's pasted rows pass). Removed once the child
    has ended, or by the sweep that finds its worker gone (the row keeps the settings)."""
    return Path(job.log_path).with_suffix(".config.json")


def mark_zombies() -> int:
    """Running jobs whose worker is gone can never finish: mark them, from
    what is on disk: `done` when the child finished and its output is there,
    else `zombie`. Each is claimed by a conditional update, so two workers
    sweeping at once mark it once."""
    count = 0
    for job in Job.objects.filter(status="running"):
        reason = _worker_gone(job)
        if reason is None:
            continue
        with contextlib.suppress(OSError, ValueError):  # a log path that is no folder's, or none: nothing there
            settings_file(job).unlink(missing_ok=True)  # its worker, which would have removed it, is gone
        done = _finished_on_disk(job)
        if done is not None:
            job.status, job.ended_at, job.progress = "done", timezone.now(), 1.0
            job.output_path, job.message, job.error = done.get("output_dir"), json.dumps(done.get("summary", {})), None
            with transaction.atomic():
                if Job.objects.filter(id=job.id, status="running").update(
                        status=job.status, ended_at=job.ended_at, progress=job.progress, output_path=job.output_path,
                        message=job.message, error=None):
                    after_end(job)
                    count += 1
            _release(job.id, mine_only=False)
            continue
        job.status, job.ended_at, job.error = "zombie", timezone.now(), job.error or reason
        with transaction.atomic():
            if not Job.objects.filter(id=job.id, status="running").update(
                    status=job.status, ended_at=job.ended_at, error=job.error):
                continue
            emit_safely(job, "failed", error=job.error)
            after_end(job)
        _release(job.id, mine_only=False)
        count += 1
    return count


def _release(job_id: str, mine_only: bool = True) -> None:
    if presence.enabled():
        try:
            presence.release(job_id, mine_only)
        except Exception as exc:  # the owner record only matters while the job runs
            log.warning("job %s: could not drop its owner record: %s", job_id, exc)


def emit_safely(job: Job, event_type: str, **fields) -> None:
    """Append to a job's event log; the row is what counts, so a log that
    cannot be written is logged here and never leaves a job stuck running."""
    try:
        job.event_log().emit(event_type, **fields)
    except OSError as exc:
        log.warning("job %s: could not append to its event log %s: %s", job.id, job.log_path, exc)


def _apply(job: Job, events: list[dict], state: dict) -> None:
    for e in events:
        kind = e.get("type")
        if kind == "stage":
            job.progress = float(e.get("progress", job.progress))
            job.message = e.get("message") or e.get("stage")
        elif kind == "metric" and e.get("total_steps"):
            job.progress = min(float(e["step"]) / float(e["total_steps"]), 0.99)
        elif kind == "done":
            state["done"] = e
        elif kind == "failed":
            state["failed"] = e


def run(job_id: str) -> None:
    started = timezone.now()
    if presence.enabled() and not presence.claim(job_id):  # before the row says running: never ownerless
        return  # a live worker has it already
    if not Job.objects.filter(id=job_id, status="queued").update(status="running", started_at=started,
                                                                  worker_pid=os.getpid(),
                                                                  worker_host=settings.HEARTH_WORKER_HOST):
        _release(job_id)
        return  # cancelled (or gone) while it waited
    job = Job.objects.get(id=job_id)
    events = job.event_log()
    stderr_path = Path(job.log_path).with_suffix(".stderr")  # the child's output stays on the worker's host
    config_path = settings_file(job)
    state: dict[str, dict] = {}  # "done" or "failed": the child's closing event
    child, code, cancelled = None, None, False
    try:
        events.emit("started")
        stderr_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(job.config_json, encoding="utf-8")
        with open(stderr_path, "wb") as stderr:
            # From this consumer thread, which lives as long as the worker (see `spawn`).
            child = spawn([sys.executable, "-m", "jobs.child", registry.get(job.kind).run_module,
                           job.log_path, str(config_path)],
                          stdout=stderr, stderr=subprocess.STDOUT, start_new_session=True,
                          env=dict(os.environ, HEARTH_REDIS_URL=settings.HEARTH_REDIS_URL))
        Job.objects.filter(id=job.id).update(child_pid=child.pid)
        offset = 0
        while True:
            code = child.poll()
            new, offset = events.read(offset)
            _apply(job, new, state)
            if new:
                Job.objects.filter(id=job.id).update(progress=job.progress, message=job.message)
            if code is not None:
                break
            if not cancelled and Job.objects.filter(id=job.id, status="cancelled").exists():
                cancelled = True
                _stop(child)
            time.sleep(POLL_S)
    except Exception as exc:  # the worker itself failed: stop the child, record why
        log.exception("supervising job %s failed", job.id)
        if child is not None and child.poll() is None:
            _stop(child)
        state.pop("done", None)
        state["failed"] = {"error": f"the worker failed while running the job: {type(exc).__name__}: {exc}"}
        emit_safely(job, "failed", error=state["failed"]["error"])
        code, cancelled = -1, False
    with contextlib.suppress(OSError):  # never written where the log's folder is no folder
        config_path.unlink(missing_ok=True)  # the row keeps the settings
    _finish(job, code, state, cancelled, stderr_path)
    _release(job.id)


def _stop(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _finish(job: Job, code: int, state: dict, cancelled: bool, stderr_path: Path) -> None:
    job.refresh_from_db()
    job.ended_at = timezone.now()
    if code == 0 and "done" in state:  # finished before a cancel could stop it: the output stands
        done = state["done"]
        job.status, job.progress, job.output_path = "done", 1.0, done.get("output_dir")
        job.message, job.error = json.dumps(done.get("summary", {})), None
    elif cancelled or job.status == "cancelled":
        job.status, job.error = "cancelled", "cancelled by request"
        emit_safely(job, "failed", error=job.error)
    else:
        if "failed" in state:
            job.error = state["failed"].get("error")
        elif code < 0:
            job.error = f"the job's process was killed by signal {-code}"
            if -code == signal.SIGKILL:
                job.error += " (out of memory, or killed from outside)"
        else:
            job.error = f"the job's process exited with code {code}: {_tail(stderr_path)}"
        job.status = "failed"
        if "failed" not in state:
            emit_safely(job, "failed", error=job.error)
    end(job)
    log.info("job %s %s%s", job.id, job.status, f": {job.error}" if job.error else "")


def end(job: Job, fields: list[str] | None = None) -> None:
    """Record a job's end and run its kind's end hook in one transaction, so
    no reader sees the job ended before the hook's own writes (a synthesis
    run's `last_synthesized_at`, a fine-tune's adapter row) have landed."""
    with transaction.atomic():
        job.save(update_fields=fields)
        after_end(job)


def after_end(job: Job) -> None:
    """The kind's own end hook, once its job has ended, however it ended
    (done, failed, cancelled while queued, or found a zombie). A failing hook
    is logged; its writes are undone, the job's end stands."""
    try:
        hook = registry.get(job.kind).after_end
        if hook is not None:
            with transaction.atomic():
                hook(job)
    except Exception:
        log.exception("job %s: its %s end hook failed", job.id, job.kind)
