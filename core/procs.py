"""Process checks: whether a pid is alive and still the process it was, and
tying a process's life to its parent's. No Django here, and no imports of
the project's apps.

Every process a Hearth process starts is started by `spawn`: it ends when
its parent ends, SIGKILL of the parent included. The kernel's parent-death
signal is asked for in the child before the program runs (`setpriv
--pdeathsig`, util-linux), and a Hearth child reads `HEARTH_PARENT` at
start (`tie_to_spawner`) and also watches its parent, which is what holds
on macOS. Secrets a child must not see are named once, in `SECRET_ENV`.

A pid alone names a process only while it lives; once it exits the number
may be handed to another one. Wherever a pid is remembered across restarts,
its start time goes with it, and `same_process` checks both."""
from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

log = logging.getLogger("hearth.procs")
PR_SET_PDEATHSIG = 1
# A child started by `spawn` finds "<parent pid>:<signal number>" here.
PARENT_ENV = "HEARTH_PARENT"
# The secrets Hearth reads from its environment, named here only (a test holds every other module to
# that), never handed to a process that does not need them. The server's keys: what its clients hold.
SERVER_KEYS = ("HEARTH_API_KEY", "HEARTH_INTERNAL_KEY")
REMOTE_KEYS = ("HEARTH_MODELS_REMOTE_KEY",)  # what the router's remote hosts take (--models-remote-key)
HUB_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
SITE_KEYS = ("HEARTH_SECRET_KEY",)  # signs the dashboard's sign-in sessions
# What a program that is not Hearth's own never sees: a client's chat template or a grammar compile (their
# worker processes), a tool's command, ffmpeg, git.
SECRET_ENV = SERVER_KEYS + REMOTE_KEYS + HUB_TOKENS + SITE_KEYS
START_TIME_SLACK_S = 0.05  # start times read by two processes may differ in the last digits


def hearth_argv(*args: str) -> list[str]:
    """`python -m hearth.cli ARGS` for this interpreter, as every Hearth
    process starts another. `-m` puts the working directory first on
    sys.path, and the editable install finds the project's packages only
    after it: run from a folder holding a `hearth/` (a HEARTH_HOME named so,
    or the clone itself, seen from its parent), `hearth` became that empty
    folder and its commands (serve, run, blas) were unknown. `-P` (Python
    3.11+) leaves the working directory out; on 3.10 there is no such flag."""
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *safe_path, "-m", "hearth.cli", *args]


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


def _tied_argv(argv: Sequence[str], signum: int) -> list[str]:
    """`argv` run under util-linux's `setpriv --pdeathsig`, where there is one:
    the parent-death signal is asked for in the child, before the program
    starts. (Not `preexec_fn`: it makes Python fork where it would vfork, and
    a fork runs OpenBLAS's at-fork handler, which tears down its thread pool
    under a matrix product another thread has running: that product never
    ends.)"""
    setpriv = _setpriv()
    if setpriv is None or shutil.which(argv[0]) is None:  # a program not found fails as Popen says it
        return list(argv)
    return [setpriv, "--pdeathsig", signal.Signals(signum).name.removeprefix("SIG"), "--", *argv]


@functools.cache
def _setpriv() -> str | None:
    return shutil.which("setpriv") if sys.platform.startswith("linux") else None


def spawn(argv: Sequence[str], *, env: dict | None = None, hide: Sequence[str] = (),
          on_parent_exit: int = signal.SIGKILL, **popen) -> subprocess.Popen:
    """Start `argv` as a child that ends when this process ends: Popen's
    keywords, with `env` (default: this process's) less the names in `hide`.

    Linux sends the parent-death signal when the *thread* that started the
    child exits, so call this from a thread that lives as long as the child
    should (the main thread, the server's loop, a supervisor's own thread).
    A Hearth child reads `PARENT_ENV` (`tie_to_spawner`): it then also
    watches its parent, which covers a parent gone before the signal was
    asked for and platforms without one; it stops with `on_parent_exit`
    (SIGTERM lets a server drain first)."""
    return subprocess.Popen(_tied_argv(argv, on_parent_exit),
                            **tied(env=env, hide=hide, on_parent_exit=on_parent_exit), **popen)


def run(argv: Sequence[str], *, env: dict | None = None, hide: Sequence[str] = (),
        on_parent_exit: int = signal.SIGKILL, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` for a child started as `spawn` starts one (a probe,
    ffmpeg, git): safe from any thread, since the caller waits for it."""
    return subprocess.run(_tied_argv(argv, on_parent_exit),
                          **tied(env=env, hide=hide, on_parent_exit=on_parent_exit), **kwargs)


def tied(*, env: dict | None = None, hide: Sequence[str] = (), on_parent_exit: int = signal.SIGKILL) -> dict:
    """The environment `spawn` starts a child with: `env` less `hide`, and
    `PARENT_ENV` naming this process and the signal. For a Hearth program
    started another way (asyncio's subprocesses), which ties itself with it."""
    base = dict(os.environ if env is None else env)
    for name in hide:
        base.pop(name, None)
    base[PARENT_ENV] = f"{os.getpid()}:{int(on_parent_exit)}"
    return {"env": base}


def tie_to_spawner() -> int | None:
    """In a process `spawn` started: stop with the signal it named when the
    parent is gone (the parent-death signal is in place already; this adds
    the watch). The variable is removed, so this process's own children are
    tied to it, not to its parent. Returns the parent's pid, or None when no
    Hearth process started this one."""
    given = os.environ.pop(PARENT_ENV, "")
    try:
        pid_text, _, signum_text = given.partition(":")
        parent, signum = int(pid_text), int(signum_text or signal.SIGTERM)
    except ValueError:
        return None
    tie_to_parent(parent, signum)
    global spawner
    spawner = parent
    return parent


spawner: int | None = None  # the Hearth process that started this one (`tie_to_spawner`)
