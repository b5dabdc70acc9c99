"""Workers on one Redis, on any number of hosts: which worker runs which
job, and whether that worker still lives.

A pid means something only on its own host, so with Redis each worker
names itself `HOST:PID` (HEARTH_WORKER_HOST, default the host name) and
keeps a key `hearth:worker:HOST:PID` alive with a heartbeat (a time-to-live
of three beats). Before a job's row turns `running`, its worker records
itself as the job's owner (`hearth:job-owner:ID`, removed when the job
ends). A running job's worker is gone when:

- it was on this host: its pid is no longer that process (immediate, as on
  one machine);
- it was on another host: its heartbeat key has expired;
- no owner is recorded (a job started before Hearth ran on Redis): its pid
  is checked here, as on one machine.

Every worker sweeps for such jobs at each heartbeat, so a worker that dies
on one host has its job marked zombie by a worker on another."""
from __future__ import annotations

import json
import logging
import os
import threading
import time

from django.conf import settings
from django.db import close_old_connections

from jobs.events import redis_client

log = logging.getLogger("hearth.jobs")
WORKER_PREFIX = "hearth:worker:"
OWNER_PREFIX = "hearth:job-owner:"
TTL_BEATS = 3


def enabled() -> bool:
    return bool(settings.HEARTH_REDIS_URL)


def me() -> str:
    return f"{settings.HEARTH_WORKER_HOST}:{os.getpid()}"


def _client():
    return redis_client(settings.HEARTH_REDIS_URL)


def _ttl_ms() -> int:
    return int(settings.HEARTH_WORKER_HEARTBEAT_S * TTL_BEATS * 1000)


def beat() -> None:
    """Say this worker is alive for three more heartbeats."""
    _client().set(WORKER_PREFIX + me(), json.dumps({"pid": os.getpid(), "host": settings.HEARTH_WORKER_HOST,
                                                    "at": time.time()}), px=_ttl_ms())


def claim(job_id: str) -> bool:
    """Record this worker as the job's owner (before its row says running).
    False when a live worker holds it already (a queue entry delivered twice):
    that worker runs it. An owner whose heartbeat is gone is replaced."""
    ensure_heartbeat()
    client, key = _client(), OWNER_PREFIX + job_id
    if client.set(key, me(), nx=True):
        return True
    held = owner(job_id)
    if held == me():
        return True
    if held is not None and client.exists(WORKER_PREFIX + held):
        return False
    client.set(key, me())
    return True


_RELEASE_MINE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def release(job_id: str, mine_only: bool = True) -> None:
    """Drop the job's owner record: this worker's own, or whoever's (`mine_only=False`, for a zombie)."""
    if mine_only:
        _client().eval(_RELEASE_MINE, 1, OWNER_PREFIX + job_id, me())
    else:
        _client().delete(OWNER_PREFIX + job_id)


def owner(job_id: str) -> str | None:
    value = _client().get(OWNER_PREFIX + job_id)
    return value.decode() if value is not None else None


def owner_gone(job_id: str) -> tuple[bool, str] | None:
    """Whether the job's recorded owner is gone, and how it is named; None
    when no owner is recorded or it ran on this host (the pid check decides)."""
    name = owner(job_id)
    if name is None or name.rpartition(":")[0] == settings.HEARTH_WORKER_HOST:
        return None
    return worker_gone(name), name


def worker_gone(name: str) -> bool:
    """Whether the worker `name` (HOST:PID) has stopped beating."""
    return not _client().exists(WORKER_PREFIX + name)


class Heartbeat:
    """A worker's heartbeat thread: beats, then sweeps for zombie jobs."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-worker-heartbeat", daemon=True)

    def start(self) -> None:
        beat()
        self._thread.start()

    def _run(self) -> None:
        from jobs.runner import mark_zombies

        while not self._stop.wait(settings.HEARTH_WORKER_HEARTBEAT_S):
            try:
                beat()
                close_old_connections()
                found = mark_zombies()
                if found:
                    log.warning("marked %d job(s) of a dead worker as zombie", found)
            except Exception:  # Redis or the database away for a moment: try again at the next beat
                log.exception("worker heartbeat failed")

    def stop(self) -> None:
        self._stop.set()
        try:
            _client().delete(WORKER_PREFIX + me())
        except Exception:
            pass


_heartbeat: Heartbeat | None = None
_heartbeat_lock = threading.Lock()


def ensure_heartbeat() -> None:
    """Start this process's heartbeat unless it runs: `hearth worker` at its
    start, and any other process the moment it runs a job (`hearth memory
    synthesize` runs its own), so no sweep elsewhere takes its job for a zombie."""
    global _heartbeat
    with _heartbeat_lock:
        if _heartbeat is None:
            _heartbeat = Heartbeat()
            _heartbeat.start()


def stop_heartbeat() -> None:
    global _heartbeat
    with _heartbeat_lock:
        if _heartbeat is not None:
            _heartbeat.stop()
            _heartbeat = None
