"""A model folder made on this machine (a demo build, a quantize job's
output, a test's tiny model) placed into the local HF cache the way a
download lands there, so the library lists it and `mlx_lm.load` loads it
by its repo id."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from core.fs import write_atomically


def publish_to_cache(src: Path, repo_id: str, cache_dir: Path) -> Path:
    """Copy a model directory into the HF cache layout (blobs, a snapshot of
    symlinks, refs/main) and return the snapshot path. The revision is the
    hash of the content, so the same build lands in the same snapshot."""
    files = sorted(p for p in src.iterdir() if p.is_file())
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    revision = hashlib.sha1(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    repo_dir = cache_dir / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / revision
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    staging = snapshot.with_name(revision + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for p in files:
        blob = repo_dir / "blobs" / digests[p.name]
        if not blob.exists():
            shutil.copyfile(p, blob.with_suffix(".incomplete"))
            os.replace(blob.with_suffix(".incomplete"), blob)
        (staging / p.name).symlink_to(os.path.relpath(blob, snapshot))
    shutil.rmtree(snapshot, ignore_errors=True)
    os.replace(staging, snapshot)
    # Whole or not at all: a process killed here leaves the previous revision named, never an empty ref.
    write_atomically(repo_dir / "refs" / "main", revision, durable=False)
    return snapshot
