"""`hearth serve` keeps one `hearth worker` process alive beside it, tied to it.

The worker is started tied to its server (`core.procs.spawn`) and stops when
that process goes, so a killed server leaves no worker taking jobs. Each
worker started here is also recorded in HEARTH_HOME/run/worker-<pid>.json
(its pid and start time, and its server's), and a server that starts stops
every recorded worker whose server is gone but which still runs (a stray
whose stop signal never came: SIGTERM, then SIGKILL after a grace period;
its job children go with it), then drops the stale records. Start times
are checked with the pids, so a number the OS handed to another process is
never signalled. A worker started by hand is never recorded, so never
stopped here."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from core import home
from core.fs import write_atomically
from core.procs import hearth_argv, same_process, spawn, start_time

log = logging.getLogger("hearth.jobs")
RESTART_DELAY_S = 1.0
STRAY_GRACE_S = 5.0


def record_worker(pid: int, folder: Path | None = None) -> Path | None:
    """Remember a worker this server started; None when it is already gone."""
    started = start_time(pid)
    if started is None:
        return None
    folder = folder or home.run()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"worker-{pid}.json"
    write_atomically(path, json.dumps({"worker_pid": pid, "worker_started": started, "server_pid": os.getpid(),
                                        "server_started": start_time(os.getpid())}))
    return path


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        for key in ("worker_pid", "server_pid"):
            record[key] = int(record[key])
        for key in ("worker_started", "server_started"):
            record[key] = float(record[key]) if record.get(key) is not None else None
        return record
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _job_children(proc) -> list:
    import psutil

    found = []
    for child in proc.children(recursive=True):
        try:
            if "jobs.child" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


def _terminate(pid: int, started: float, grace: float) -> bool:
    """SIGTERM the process that is `pid` started at `started`, SIGKILL it
    after `grace`; its job children (which die with it on Linux) are killed
    if they outlive it. True when it was still running."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if not same_process(pid, started):
            return False
        children = _job_children(proc)
        proc.terminate()
    except psutil.Error:
        return False
    _, alive = psutil.wait_procs([proc], timeout=grace)
    for p in alive:
        log.warning("stray job worker %d ignored SIGTERM for %.0fs; killing it", pid, grace)
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
    _, left = psutil.wait_procs(children, timeout=2.0)  # PR_SET_PDEATHSIG has them gone already on Linux
    for child in left:
        try:
            child.kill()
        except psutil.Error:
            pass
    return True


def stop_strays(folder: Path | None = None, grace: float = STRAY_GRACE_S) -> list[int]:
    """Stop the recorded workers whose server is gone; drop stale records.
    The pids stopped, logged one by one."""
    folder = folder or home.run()
    stopped: list[int] = []
    if not folder.is_dir():
        return stopped
    for path in sorted(folder.glob("worker-*.json")):
        record = _read(path)
        if record is None:
            log.warning("removing an unreadable worker record %s", path)
            path.unlink(missing_ok=True)
            continue
        if same_process(record["server_pid"], record["server_started"]):
            continue  # another running server's worker
        pid = record["worker_pid"]
        if _terminate(pid, record["worker_started"], grace):
            log.warning("stopped a stray job worker (pid %d) left running by server pid %d, which is gone",
                        pid, record["server_pid"])
            stopped.append(pid)
        path.unlink(missing_ok=True)
    for tmp in folder.glob(".worker-*.tmp"):  # a record write cut short
        tmp.unlink(missing_ok=True)
    return stopped


class WorkerSupervisor:
    """Keeps one job worker running beside the server. `server_stopping()`
    says the server has begun its stop: a worker that exits then (a
    terminal's Ctrl-C reaches the whole process group) is not started again."""

    def __init__(self, server_stopping: Callable[[], bool] = lambda: False):
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.server_stopping = server_stopping
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-worker-supervisor", daemon=True)

    def start(self) -> None:
        """Start supervising; `hearth serve` has already called `stop_strays`."""
        self._thread.start()

    def _spawn(self) -> subprocess.Popen:
        # The CLI module, so the worker gets the same BLAS preload as the server. It is
        # started from this thread, which lives as long as the server: Linux sends the
        # parent-death signal when the spawning thread exits, not only the process.
        proc = spawn(hearth_argv("worker"), on_parent_exit=signal.SIGTERM)
        try:
            record_worker(proc.pid)
        except OSError as exc:
            log.warning("could not record job worker %d: %s", proc.pid, exc)
        return proc

    @staticmethod
    def _forget(pid: int) -> None:
        try:
            (home.run() / f"worker-{pid}.json").unlink(missing_ok=True)
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.proc = self._spawn()
            log.info("job worker started (pid %d)", self.proc.pid)
            code = self.proc.wait()
            self._forget(self.proc.pid)
            # A moment first: the signal that stopped the worker may be the server's own stop, not yet seen.
            if self._stopping.wait(RESTART_DELAY_S) or self.server_stopping():
                return
            self.restarts += 1
            log.warning("job worker exited with %s; restarting", code)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None:
            self._forget(proc.pid)
