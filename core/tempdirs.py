"""Temporary folders that a killed process does not leave behind for good.

A process SIGKILLed (kill -9, the OOM killer) runs no cleanup, so a folder it made with `tempfile.mkdtemp` would
stay in /tmp until a reboot. A folder made here holds an owner file naming its process (pid and start time),
and the next process to make one of the same kind removes those whose process has ended. A folder without
that file, or whose process still runs (the same pid started at the same time), is left alone. The stdlib's
`tempfile` has no such sweep."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from core.procs import same_process, start_time

OWNER = ".hearth-owner.json"  # {"pid": N, "started": seconds since the epoch}


@contextlib.contextmanager
def owned_tempdir(prefix: str) -> Iterator[Path]:
    """A new, empty folder to work in, removed when the block ends: `work` in `<prefix><random>` in the system's
    temporary folder, beside the owner file (so what the caller writes and publishes holds no file of ours).
    This user's folders of the same prefix whose process has ended are removed first."""
    sweep(prefix)
    holder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        (holder / OWNER).write_text(json.dumps({"pid": os.getpid(), "started": start_time(os.getpid())}))
        work = holder / "work"
        work.mkdir()
        yield work
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def sweep(prefix: str) -> list[Path]:
    """Remove the folders `owned_tempdir(prefix)` made for processes that have ended; the ones removed."""
    removed: list[Path] = []
    try:
        entries = list(Path(tempfile.gettempdir()).glob(f"{prefix}*"))
    except OSError:
        return removed
    for entry in entries:
        try:
            if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
                continue
            owner = json.loads((entry / OWNER).read_text())
            pid, started = int(owner["pid"]), owner["started"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not made here, or its owner file not yet written: not ours to judge
        if same_process(pid, started):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed
