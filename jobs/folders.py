"""Turning a folder a browser picked (it only knows the folder's name) into
a servable model path in the local Hugging Face cache."""
from __future__ import annotations

import re
from pathlib import Path

from core.paths import PathRefused, is_inside, read_json, read_text, refusal

NOT_FOUND = "Couldn't locate this folder on disk — paste the path instead."


class FolderNotFound(Exception):
    """The picked folder names no model this server can find."""
_HASH = re.compile(r"^[0-9a-f]{40}$")


def _answer(path: Path, repo_id: str | None) -> dict:
    if not is_inside(path.resolve()):  # a snapshot found through a ref or link that leads out
        raise FolderNotFound(NOT_FOUND)
    out: dict = {"ok": True, "path": str(path)}
    if repo_id:
        out["repo_id"] = repo_id
    try:  # through open_regular: a FIFO put there since the check is never opened
        config = read_json(path / "config.json", "config.json")
        model_type = config.get("model_type") if isinstance(config, dict) else None
    except (OSError, ValueError):
        model_type = None
    if model_type:
        out["model_type"] = model_type
    return out


def _repo_snapshot(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    try:
        snap = repo_dir / "snapshots" / read_text(ref, "ref", 4096).strip()
    except (ValueError, OSError):  # missing, not a regular file, or not a ref
        snap = None
    if snap is not None and snap != repo_dir / "snapshots" and (snap / "config.json").is_file():
        return snap
    snaps = sorted((p for p in (repo_dir / "snapshots").glob("*") if (p / "config.json").is_file()),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    return snaps[0] if snaps else None


def _repo_id(repo_dir_name: str) -> str | None:
    if not repo_dir_name.startswith("models--"):
        return None
    return repo_dir_name.removeprefix("models--").replace("--", "/", 1)


def resolve_folder(hub_cache: Path, folder_name: str | None, rel_path: str | None) -> dict:
    """The model a picked folder names (FolderNotFound when none). A name that resolves outside the
    allowed roots (core.paths) raises PathRefused, whether or not it exists."""
    for raw, what in ((rel_path, "rel_path"), (folder_name, "folder_name")):
        if not raw or not isinstance(raw, str) or "\x00" in raw:
            continue
        candidate = Path(raw).expanduser()
        if not candidate.is_absolute():
            candidate = hub_cache / raw
        try:
            candidate = candidate.resolve()
        except (OSError, RuntimeError):
            raise PathRefused(refusal(what)) from None
        if not is_inside(candidate):
            raise PathRefused(refusal(what))
        if candidate.name.startswith("models--") and candidate.is_dir():
            snap = _repo_snapshot(candidate)
            if snap is not None:
                return _answer(snap, _repo_id(candidate.name))
        if (candidate / "config.json").is_file():
            repo_dir = candidate.parent.parent if candidate.parent.name == "snapshots" else None
            return _answer(candidate, _repo_id(repo_dir.name) if repo_dir else None)
    if folder_name and _HASH.match(folder_name):  # a snapshot picked by its hash
        for snap in hub_cache.glob(f"models--*/snapshots/{folder_name}"):
            if (snap / "config.json").is_file():
                return _answer(snap, _repo_id(snap.parent.parent.name))
    raise FolderNotFound(NOT_FOUND)


def stamped(root: Path, prefix: str) -> Path:
    """A new, unused folder name under `root`: `<prefix>-<UTC time>-<random>`."""
    import time
    import uuid

    return root / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
