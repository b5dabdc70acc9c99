"""Process checks: whether a pid is alive and still the process it was, and
tying a process's life to its parent's. No Django here, and no imports of
the project's apps.

A pid alone names a process only while it lives; once it exits the number
may be handed to another one. Wherever a pid is remembered across restarts,
its start time goes with it, and `same_process` checks both."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("hearth.procs")
PR_SET_PDEATHSIG = 1
START_TIME_SLACK_S = 0.05  # start times read by two processes may differ in the last digits


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def start_time(pid: int | None) -> float | None:
    """When the process `pid` started (seconds since the epoch), or None when it is gone."""
    import psutil

    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return None


def same_process(pid: int | None, started: float | None) -> bool:
    """True while `pid` is still the process that started at `started`."""
    now = start_time(pid)
    return now is not None and started is not None and abs(now - float(started)) <= START_TIME_SLACK_S


def started_before(pid: int | None, moment: float) -> bool:
    """True when `pid` is alive and was already running at `moment` (so a
    process that took over the number later does not count)."""
    began = start_time(pid)
    return began is not None and began <= moment + START_TIME_SLACK_S


def proc_bytes(path: str, field: str) -> int | None:
    """A `Field:  N kB` line of a /proc file (meminfo, a process's status) in
    bytes; None where the file or the field cannot be read (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def die_with_parent(signum: int) -> bool:
    """Ask Linux to send `signum` to this process when the thread that
    started it exits (PR_SET_PDEATHSIG); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(parent: int, on_gone: Callable[[], None], interval: float = 1.0) -> threading.Thread:
    """Call `on_gone` once the parent process `parent` is gone (this process
    was handed to another parent). Portable: macOS has no parent-death signal."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(interval):
            if os.getppid() != parent:
                log.warning("parent process %d is gone; stopping", parent)
                on_gone()
                return

    thread = threading.Thread(target=watch, name="hearth-parent-watch", daemon=True)
    thread.start()
    return thread


def tie_to_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """Stop this process with `signum` when `parent` exits: the parent-death
    signal where the OS has one, and a parent watch everywhere."""
    def stop() -> None:
        os.kill(os.getpid(), signum)

    die_with_parent(signum)
    if os.getppid() != parent:  # the parent went before the signal was asked for
        stop()
        return
    watch_parent(parent, stop)
