"""A temporary folder made by a process that was killed (no cleanup ran) is removed by the next process that
makes one of its kind; folders of live processes, other kinds and other names stay."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from core.tempdirs import owned_tempdir


def test_a_killed_processs_folder_goes_at_the_next_start_and_a_live_ones_stays():
    prefix = f"hearth-test-{uuid.uuid4().hex[:8]}-"
    root = Path(tempfile.gettempdir())
    gone = subprocess.Popen(["sleep", "60"])
    gone.kill()
    gone.wait()  # its pid now names no process: a build SIGKILLed mid-way
    left = root / f"{prefix}{gone.pid}-abc"
    (left / "step-40").mkdir(parents=True)
    (left / "step-40" / "model.safetensors").write_bytes(b"x" * 1024)
    live = root / f"{prefix}{os.getppid()}-def"  # the test runner's parent: alive
    other = root / f"{prefix}whisper-{gone.pid}-ghi"  # another kind's name: not this prefix's to judge
    for folder in (live, other):
        folder.mkdir()
    try:
        made = owned_tempdir(prefix)
        assert made.is_dir() and made.name.startswith(f"{prefix}{os.getpid()}-")
        assert not left.exists()
        assert live.is_dir() and other.is_dir()
        again = owned_tempdir(prefix)  # this process is alive: its first folder stays
        assert made.is_dir() and again != made
    finally:
        for folder in root.glob(f"{prefix}*"):
            shutil.rmtree(folder, ignore_errors=True)
