"""Writing a file so that a reader sees it whole or not at all.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: str | bytes, mode: int | None = None, durable: bool = True) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, and
    rename it over `path`: a crash leaves the old file or the new one, never
    a torn one. `mode` sets the permission bits (a new file otherwise gets
    0644, an existing one keeps its own); the temporary file never has wider
    ones."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
