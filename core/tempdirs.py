"""Temporary folders that a killed process does not leave behind for good.

A process SIGKILLed (kill -9, the OOM killer) runs no cleanup, so a folder it made with `tempfile.mkdtemp` would
stay in /tmp until a reboot. Folders made here carry their process's id in their name, and the next process to
make one of the same kind removes those whose process is gone. The stdlib's `tempfile` has no such sweep."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from core.procs import pid_alive


def owned_tempdir(prefix: str) -> Path:
    """A new folder `<prefix><pid>-<random>` in the system's temporary folder, after removing this user's folders
    of the same prefix whose process has ended."""
    sweep(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def sweep(prefix: str) -> list[Path]:
    """Remove the folders `owned_tempdir(prefix)` made for processes that have ended; the ones removed."""
    removed: list[Path] = []
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.glob(f"{prefix}*"))
    except OSError:
        return removed
    for entry in entries:
        pid = entry.name[len(prefix):].split("-", 1)[0]
        try:
            if not pid.isdigit() or pid_alive(int(pid)) or entry.is_symlink() or not entry.is_dir() \
                    or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed
