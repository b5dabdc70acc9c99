"""Downloads as background work with a database row each.

`start()` records a `Download` and runs it on a thread of its own (never
the request's); its progress lands in the row about four times a second,
and how it ends (done, or the error) is recorded. A process that starts
serving picks up downloads whose process died mid-way, and they continue
from their partial files.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from core import db
from hub import reach
from hub.download import Progress, download
from hub.models import Download

log = logging.getLogger("hearth.hub")
_threads: dict[int, threading.Thread] = {}
_lock = threading.Lock()


class DuplicateDownload(Exception):
    pass


def _alive(pid: int | None) -> bool:
    from core.procs import pid_alive

    return pid_alive(pid)


def running(repo_id: str) -> Download | None:
    for row in Download.objects.filter(repo_id=repo_id, state__in=("queued", "active")):
        if _alive(row.owner_pid):
            return row
    return None


def create(repo_id: str, revision: str = "main") -> Download:
    """A new row owned by this process; DuplicateDownload while one runs."""
    with transaction.atomic():
        db.serialize(f"hub.download:{repo_id}")
        if running(repo_id) is not None:
            raise DuplicateDownload(f"a download for {repo_id} is already in progress")
        for stale in Download.objects.filter(repo_id=repo_id, state__in=("queued", "active")):
            _fail(stale, "interrupted: its process stopped; a new download took over")
        return Download.objects.create(repo_id=repo_id, revision=revision, owner_pid=os.getpid())


def run(row: Download, report_extra=None, stop=lambda: False) -> Download:
    """Download in this thread, keeping the row current."""
    from huggingface_hub import constants

    from hub.hf import saved_token

    progress = Progress()

    def report(p: Progress) -> None:
        Download.objects.filter(pk=row.pk).update(
            state="active", current_file=p.current_file, received_bytes=p.received_bytes,
            total_bytes=p.total_bytes, files_done=p.files_done, files_total=p.files_total,
            bytes_per_sec=p.bytes_per_sec)
        if report_extra is not None:
            report_extra(p)

    try:
        commit, _ = download(row.repo_id, row.revision, Path(constants.HF_HUB_CACHE), saved_token(), progress,
                             report, stop)
    except KeyboardInterrupt:
        _fail(row, "interrupted; downloading it again continues from the partial files")
        raise
    except Exception as exc:
        log.warning("download of %s failed: %s", row.repo_id, exc)
        _fail(row, _explain(exc), reach.detail(exc))
    else:
        Download.objects.filter(pk=row.pk).update(state="done", commit=commit, current_file=None,
                                                  bytes_per_sec=0.0, finished_at=timezone.now())
        log.info("downloaded %s@%s", row.repo_id, commit[:12])
    row.refresh_from_db()
    return row


def _explain(exc: Exception) -> str:
    """The sentence a person reads for a failed download (the exception's own text is its detail)."""
    from huggingface_hub.errors import OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set: nothing can be downloaded"
    if isinstance(exc, RepositoryNotFoundError):
        return "no such repository on the hub (or it is private and no token is saved)"
    if isinstance(exc, RevisionNotFoundError):
        return "no such revision on the hub"
    return reach.failure(exc) or f"The download stopped: {exc}"


def _fail(row: Download, message: str, detail: str | None = None) -> None:
    Download.objects.filter(pk=row.pk).update(state="error", error=message, detail=detail, bytes_per_sec=0.0,
                                              finished_at=timezone.now())


def start(repo_id: str, revision: str = "main") -> Download:
    row = create(repo_id, revision)
    _spawn(row)
    return row


def _spawn(row: Download) -> None:
    def work():
        close_old_connections()
        try:
            run(row)
        finally:
            connection.close()
            with _lock:
                _threads.pop(row.pk, None)

    thread = threading.Thread(target=work, name=f"download-{row.repo_id}", daemon=True)
    with _lock:
        _threads[row.pk] = thread
    thread.start()


def resume_interrupted() -> int:
    """Continue the downloads whose process died; at server start."""
    count = 0
    for row in Download.objects.filter(state__in=("queued", "active")):
        if _alive(row.owner_pid) and row.owner_pid != os.getpid():
            continue
        claimed = Download.objects.filter(pk=row.pk, state__in=("queued", "active"), owner_pid=row.owner_pid) \
            .update(owner_pid=os.getpid(), error=None, detail=None)
        if not claimed:  # another process took it (or ended it) meanwhile
            continue
        row.refresh_from_db()
        log.info("resuming the download of %s", row.repo_id)
        _spawn(row)
        count += 1
    return count
