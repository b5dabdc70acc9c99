"""A temporary folder made by a process that was killed (no cleanup ran) is removed by the next process that
makes one of its kind; folders of live processes and folders without an owner file stay."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from core.procs import start_time
from core.tempdirs import OWNER, owned_tempdir


def _folder(root: Path, name: str, owner: dict | None) -> Path:
    folder = root / name
    (folder / "step-40").mkdir(parents=True)
    (folder / "step-40" / "model.safetensors").write_bytes(b"x" * 1024)
    if owner is not None:
        (folder / OWNER).write_text(json.dumps(owner))
    return folder


def test_a_killed_processs_folder_goes_at_the_next_start_and_a_live_ones_stays():
    prefix = f"hearth-test-{uuid.uuid4().hex[:8]}-"
    root = Path(tempfile.gettempdir())
    gone = subprocess.Popen(["sleep", "60"])
    started = start_time(gone.pid)
    gone.kill()
    gone.wait()  # a build SIGKILLed mid-way: its pid names no process now
    parent = os.getppid()
    left = _folder(root, f"{prefix}a", {"pid": gone.pid, "started": started})
    reused = _folder(root, f"{prefix}b", {"pid": parent, "started": 1.0})  # its pid now names another process
    live = _folder(root, f"{prefix}c", {"pid": parent, "started": start_time(parent)})
    unowned = _folder(root, f"{prefix}d", None)  # not made by owned_tempdir: left alone
    try:
        with owned_tempdir(prefix) as work:
            holder = work.parent
            assert work.is_dir() and not any(work.iterdir())  # the caller's folder holds nothing of ours
            assert json.loads((holder / OWNER).read_text())["pid"] == os.getpid()
            assert not left.exists() and not reused.exists()
            assert live.is_dir() and unowned.is_dir()
            with owned_tempdir(prefix) as again:  # this process is alive: its first folder stays
                assert work.is_dir() and again != work
        assert not holder.exists()  # the block's end removes it, owner file and all
    finally:
        for folder in root.glob(f"{prefix}*"):
            shutil.rmtree(folder, ignore_errors=True)
