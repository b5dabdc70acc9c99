"""Writing a file so that a reader sees it whole or not at all.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def write_atomically(path: Path, data: str | bytes, mode: int | None = None, durable: bool = True) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, and
    rename it over `path`: a crash leaves the old file or the new one, never
    a torn one. `mode` sets the permission bits; without it an existing file
    keeps its own and a new one gets what the process's umask leaves of
    0666, as `open` would give it. The temporary file never has wider bits
    than the file it becomes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None and path.exists():
        mode = path.stat().st_mode & 0o7777
    # The kernel applies the umask to a new file's bits, which a read of the
    # umask (os.umask sets it while it reads, for every thread) could not do safely.
    fd, tmp = _create_beside(path, 0o666 if mode is None else 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _create_beside(path: Path, bits: int) -> tuple[int, Path]:
    """A new, empty file `.<name>.<random>.tmp` in `path`'s folder, opened
    for writing, created with `bits` less the umask."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, _FLAGS, bits), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")
