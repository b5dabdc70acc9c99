"""Coordination between processes that touch the HF cache.

A repo lock (`flock` on `<repo>/.hearth.lock`) is held by a download for
its whole run; GC skips a repo whose lock it cannot take, and the registry
does not list a repo's first download until it has finished. Each serving
process records the snapshot it serves under HEARTH_HOME/serving/<pid>,
so GC in any process keeps it."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from core import home
from core.fs import write_atomically


@contextlib.contextmanager
def repo_lock(root: Path, blocking: bool = True):
    """Yield True with the lock held, or False when `blocking` is off and
    another process (or thread) holds it."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".hearth.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def is_locked(root: Path) -> bool:
    if not (root / ".hearth.lock").exists():
        return False
    with repo_lock(root, blocking=False) as held:
        return not held


def record_serving(snapshot: Path) -> Path:
    folder = home.serving()
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / str(os.getpid())
    write_atomically(marker, str(snapshot.resolve()), durable=False)  # whole or absent: GC reads markers
    return marker


def served_snapshots() -> frozenset:
    """Snapshots live serving processes have loaded."""
    from core.procs import pid_alive

    folder = home.serving()
    found = set()
    if folder.is_dir():
        for marker in folder.iterdir():
            if marker.name.isdigit() and pid_alive(int(marker.name)):
                try:
                    found.add(Path(marker.read_text().strip()).resolve())
                except OSError:
                    pass
            elif marker.name.isdigit():
                marker.unlink(missing_ok=True)
    return frozenset(found)
