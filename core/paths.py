"""Where a request may point: every path a request names must resolve
(symlinks followed) inside HEARTH_HOME, the Hugging Face hub cache, or a
folder the operator allowed (`hearth serve --allow-path DIR`, kept in
HEARTH_ALLOW_PATHS so the worker and job children inherit it).

A refused path gets one message whether or not it exists, so a request
cannot probe the disk. The environment is read at every call: the serve
command appends its `--allow-path` folders before anything runs.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import errno
import json
import os
import re
import stat
from fnmatch import fnmatchcase
from pathlib import Path

ALLOW_ENV = "HEARTH_ALLOW_PATHS"
ADAPTER_FILES = ("adapters.safetensors", "adapter_config.json")  # what a LoRA adapter folder consists of
# In an adapter folder while a fine-tune writes it (checkpoints included); removed once training finished.
TRAINING_MARKER = ".hearth-training"
# The config of an adapter a fine-tune trains over, kept until the job ends: put back if it leaves nothing.
CONFIG_BEFORE = ".adapter_config.json.before"
JSON_LIMIT = 64 << 20  # bytes of a config file read_json takes; a config is kilobytes
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class PathRefused(ValueError):
    """A path outside the allowed roots, or one that cannot be used safely."""


def hearth_home() -> Path:
    return Path(os.environ.get("HEARTH_HOME") or "~/.hearth").expanduser().resolve()


def hf_hub_cache() -> Path:
    """The hub cache as huggingface_hub finds it: HF_HUB_CACHE, else HF_HOME/hub."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(cache).expanduser().resolve()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return (Path(home).expanduser() / "hub").resolve()


def extra_roots() -> list[Path]:
    """The folders allowed with --allow-path / HEARTH_ALLOW_PATHS (absolute entries only)."""
    out = []
    for entry in os.environ.get(ALLOW_ENV, "").split(os.pathsep):
        entry = entry.strip()
        if entry and "\x00" not in entry and Path(entry).expanduser().is_absolute():
            out.append(Path(entry).expanduser().resolve())
    return out


def allowed_roots() -> list[Path]:
    roots: list[Path] = []
    for root in (hearth_home(), hf_hub_cache(), *extra_roots()):
        if root not in roots:
            roots.append(root)
    return roots


def refusal(what: str) -> str:
    return f"{what} must be inside HEARTH_HOME, the Hugging Face cache or a folder allowed with --allow-path"


# Files of HEARTH_HOME that hold secrets (named as core/home.py names them): the Hub token, Django's
# secret key (it signs sign-in sessions), the database (sessions, tool approvals) and the MCP servers'
# settings (their environment). No request names one as a job's, tool's or upload's input, nor as a
# file to push, directly or through a symlink.
SECRET_FILES = ("hf.json", "secret_key", "mcp.json", "hearth.sqlite3", "hearth.sqlite3-wal", "hearth.sqlite3-shm",
                "hearth.sqlite3-journal")
SECRET_FILES_ENV = "HEARTH_SECRET_FILES"  # more of them, anywhere (the server's --api-key-file files)
SECRET_REFUSAL = "{what} names one of Hearth's secrets (the Hub token, the secret key, the database, a key file)"


def is_secret(path: Path) -> bool:
    """True when the already-resolved `path` is one of Hearth's secrets."""
    if path.parent == hearth_home() and path.name in SECRET_FILES:
        return True
    return any(path == Path(p) for p in os.environ.get(SECRET_FILES_ENV, "").split(os.pathsep) if p)


def is_inside(path: Path, roots: list[Path] | None = None) -> bool:
    """True when the already-resolved `path` is one of `roots` or below one,
    and not one of Hearth's secrets."""
    if is_secret(path):
        return False
    return any(path == root or path.is_relative_to(root) for root in (roots or allowed_roots()))


def confine(raw, what: str = "path") -> Path:
    """`raw` (a request's string) as a resolved path inside the allowed
    roots, or PathRefused. `~` is expanded; relative paths are refused,
    since what they mean depends on the server's working folder."""
    if not isinstance(raw, (str, os.PathLike)) or not str(raw):
        raise PathRefused(f"{what} must be a path")
    text = os.fspath(raw)
    if "\x00" in text:
        raise PathRefused(f"{what} must not contain NUL")
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate (JSON lets a string carry one): no file has such a name
        raise PathRefused(f"{what} must be text a file name can hold (no lone surrogates)") from None
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # `~name` for a user this machine does not have
        raise PathRefused(f"{what} names the home folder of an unknown user") from None
    if not path.is_absolute():
        raise PathRefused(f"{what} must be an absolute path")
    try:
        resolved = path.resolve()  # follows every symlink, existing or not
    except (OSError, RuntimeError):  # a symlink loop
        raise PathRefused(refusal(what)) from None
    if is_secret(resolved):
        raise PathRefused(SECRET_REFUSAL.format(what=what))
    if not is_inside(resolved):
        raise PathRefused(refusal(what))
    return resolved


def holds_a_root(path: Path) -> bool:
    """True when the resolved `path` is HEARTH_HOME or the hub cache, or a
    folder above one: never an artifact's own folder, nor one to write into."""
    return any(path == root or root.is_relative_to(path) for root in (hearth_home(), hf_hub_cache()))


def confine_members(folder: Path, names, what: str = "path") -> None:
    """The files named `names` in `folder` that exist must resolve inside
    the allowed roots and be regular files: a symlink in an allowed folder
    must not lead out of it, and a FIFO must never be opened."""
    for name in names:
        member = folder / name
        if os.path.lexists(member):
            regular_file(confine(str(member), what), what)


def confine_model_ref(ref: str, what: str = "model") -> str:
    """A model reference as the loader takes it: a repo id of the cache
    (kept as is), or a path, which must be inside the allowed roots."""
    if REPO_ID.match(ref) and not ref.startswith((".", "~")) and not Path(ref).is_dir():
        return ref
    if REPO_ID.match(ref) and not Path(ref).is_absolute():
        ref = str(Path(ref).absolute())  # the loader would read it relative to the working folder
    return str(confine(ref, what))


def regular_file(path: Path, what: str = "file") -> Path:
    """`path` when it is a regular file (symlinks followed), checked with
    stat before anything opens it: a FIFO would block the reader forever
    and a device could stream without end."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise PathRefused(f"{what}: {path} is not a file") from None
    if not stat.S_ISREG(mode):
        raise PathRefused(f"{what}: {path} is not a regular file")
    return path


def open_regular(path: Path, what: str = "file"):
    """Open `path` for binary reading only if it is a regular file, and
    check the opened descriptor again (the name may have been swapped in
    between). O_NONBLOCK keeps a FIFO swapped in from blocking the open."""
    regular_file(path, what)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused(f"{what}: {path} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: Path, what: str = "file", limit: int | None = None, encoding: str = "utf-8",
              errors: str = "strict") -> str:
    """The text of a regular file, refusing one over `limit` bytes."""
    with open_regular(path, what) as f:
        if limit is not None and os.fstat(f.fileno()).st_size > limit:
            raise PathRefused(f"{what}: {path} is over {_size(limit)}")
        return f.read().decode(encoding, errors)


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


def read_json(path: Path, what: str = "file", limit: int | None = JSON_LIMIT):
    """The parsed JSON of a regular file, read through `open_regular`.
    FileNotFoundError when nothing is there (for callers that read a missing
    file as "none"), PathRefused when it is not a regular file or is over
    `limit` bytes, ValueError when it is not JSON."""
    if not os.path.exists(path):  # a broken link counts as missing
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    return json.loads(read_text(path, what, limit))


def regular_entries(folder: Path, what: str = "file", pattern: str = "*") -> None:
    """Refuse `folder` when an entry at its top level whose name matches
    `pattern` is neither a folder nor a regular file (symlinks followed):
    loaders that open files by name (mlx-lm, tokenizers, the trainer) must
    never meet a FIFO, a device or a socket. Broken links are left to the
    loader, which names what is missing."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in sorted(entries, key=lambda e: e.name):
        if not fnmatchcase(entry.name, pattern):
            continue
        try:
            mode = os.stat(entry.path).st_mode
        except OSError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise PathRefused(f"{what}: {entry.path} is not a regular file")
