"""Run a command so that nothing it starts outlives it.

`python -I reaper.py CMD...` starts CMD as its child and, on Linux, makes
itself the child subreaper: a process below it whose parent exits is
re-parented here instead of to init, so even one that left the process
group and the session (`setsid`, a double fork) stays in this tree. When
CMD exits, whatever it left running is killed, and the exit status is
CMD's. Whoever started the reaper kills the whole tree with `kill_tree`;
SIGTERM (which the server's death sends it: the parent-death signal it
asks for at start) makes it kill the tree and exit.

Runs as a script in the tool's process (no Django, no app imports);
`chat/tools.py` imports `kill_tree` from it."""
from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def kill_tree(root: int, include_root: bool = True) -> None:
    """SIGKILL every process below `root` (and `root` itself unless told not
    to), wherever its session or group. Each is stopped first, in rounds
    until no new one appears, so none can start another between being found
    and being killed."""
    import psutil

    try:
        top = psutil.Process(root)
    except psutil.Error:
        return
    found: dict[int, psutil.Process] = {}
    if include_root:
        found[root] = top
        _signal(top, signal.SIGSTOP)
    for _ in range(100):
        try:
            below = top.children(recursive=True)
        except psutil.Error:
            below = []
        fresh = [p for p in below if p.pid not in found]
        if not fresh:
            break
        for p in fresh:
            found[p.pid] = p
            _signal(p, signal.SIGSTOP)
    for p in found.values():
        _signal(p, signal.SIGKILL)


def _signal(process, sig: int) -> None:
    import psutil

    try:
        process.send_signal(sig)  # psutil refuses a pid that was reused by another process
    except psutil.Error:
        pass


def _subreaper() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _end_with_parent() -> None:
    """SIGTERM kills the tree and exits; the server that started this process
    (named in HEARTH_PARENT, as `core.procs.tied` sets it) sends it by dying."""
    def end(signum, frame) -> None:
        kill_tree(os.getpid(), include_root=False)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end)
    parent = os.environ.pop("HEARTH_PARENT", "").partition(":")[0]
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):  # gone before the signal was asked for
        os._exit(128 + signal.SIGTERM)


def main(argv: list[str]) -> int:
    _end_with_parent()
    _subreaper()
    child = os.fork()
    if child == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127)
    status = 0
    while True:  # reaps adopted orphans too, until the command itself exits
        pid, wait_status = os.wait()
        if pid == child:
            status = os.waitstatus_to_exitcode(wait_status)
            break
    kill_tree(os.getpid(), include_root=False)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
