"""Reclaiming disk in the HF cache from superseded revisions.

A snapshot no `refs/*` names is superseded and can go, unless it holds a
file the kept revisions lack (then it is skipped: deleting it would lose
that file). A blob no surviving snapshot links to is dead. A repo no ref
names at all keeps its newest snapshot. Partial downloads
(`*.incomplete`) are never touched. `plan()` only reads; `execute()`
recomputes the plan and deletes exactly what it lists.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

from core.paths import read_text


@dataclass
class RepoPlan:
    repo_id: str
    root: Path
    prune: list[Path] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)
    dead_blobs: list[Path] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # revision -> why it stays

    @property
    def reclaim_bytes(self) -> int:
        return sum(b.stat().st_size for b in self.dead_blobs if b.exists())

    def row(self) -> dict:
        return {"repo_id": self.repo_id, "prune_snapshots": len(self.prune), "skipped_snapshots": len(self.skipped),
                "dead_blobs": len(self.dead_blobs), "reclaim_bytes": self.reclaim_bytes,
                "revisions": self.revisions()}

    def revisions(self) -> list[dict]:
        """Each revision, what the plan does with it, and why."""
        out = [{"revision": name, "action": "keep", "why": why} for name, why in sorted(self.kept.items())]
        out += [{"revision": s.name, "action": "skip", "why": "holds files no kept revision has"}
                for s in self.skipped]
        out += [{"revision": s.name, "action": "remove", "why": "no ref names it and a kept revision has its files"}
                for s in self.prune]
        return out


def _has_real_files(snapshot: Path) -> bool:
    return any(p.is_file() and not p.is_symlink() for p in snapshot.rglob("*"))


def _links(snapshot: Path) -> dict[str, str]:
    """File path in the snapshot -> blob name it links to (or a content marker)."""
    out = {}
    for path in snapshot.rglob("*"):
        if path.is_symlink():
            out[str(path.relative_to(snapshot))] = Path(os.readlink(path)).name
        elif path.is_file():
            out[str(path.relative_to(snapshot))] = f"file:{path}"
    return out


def _repo_id(folder: Path) -> str | None:
    kind, _, rest = folder.name.partition("--")
    if kind not in ("models", "datasets", "spaces") or not rest:
        return None
    return rest.replace("--", "/", 1)


def plan_repo(root: Path, in_use: frozenset = frozenset()) -> RepoPlan | None:
    repo_id = _repo_id(root)
    snapshots_dir = root / "snapshots"
    if repo_id is None or not snapshots_dir.is_dir():
        return None
    snapshots = {s.name: s for s in snapshots_dir.iterdir() if s.is_dir()}
    referenced = set()
    refs = root / "refs"
    if refs.is_dir():
        for ref in refs.rglob("*"):
            try:
                referenced.add(read_text(ref, "ref", 4096).strip())
            except (OSError, ValueError):  # a folder, or not a regular file: names nothing
                continue
    plan = RepoPlan(repo_id, root)
    plan.kept = {name: "named by a ref (the revision downloads track)" for name in snapshots if name in referenced}
    if not plan.kept and snapshots:  # nothing names a revision: keep the newest
        plan.kept = {max(snapshots, key=lambda n: snapshots[n].stat().st_mtime): "the newest (no ref names one)"}
    plan.kept.update({name: "being served" for name in snapshots
                      if snapshots[name].resolve() in in_use and name not in plan.kept})
    kept = set(plan.kept)
    kept_files = {}
    for name in kept:
        kept_files.update(_links(snapshots[name]))
    for name, snapshot in sorted(snapshots.items()):
        if name in kept:
            continue
        files = _links(snapshot)
        if set(files) - set(kept_files) or _has_real_files(snapshot):
            plan.skipped.append(snapshot)  # holds files the kept revision lacks, or files of its own
        else:
            plan.prune.append(snapshot)
    surviving: set[str] = set()
    for snapshot in snapshots.values():
        if snapshot not in plan.prune:
            surviving.update(_links(snapshot).values())
    blobs = root / "blobs"
    if blobs.is_dir():
        plan.dead_blobs = sorted(b for b in blobs.iterdir()
                                 if b.is_file() and not b.name.endswith(".incomplete") and b.name not in surviving)
    return plan


def _roots(cache: Path) -> list[Path]:
    return sorted(r for r in cache.iterdir() if r.is_dir()) if cache.is_dir() else []


def _worth(repo: RepoPlan | None, busy: Collection[str]) -> TypeGuard[RepoPlan]:
    return repo is not None and repo.repo_id not in busy and bool(repo.prune or repo.skipped or repo.dead_blobs)


def plan(cache: Path, busy: Collection[str] = frozenset(), in_use: frozenset | None = None) -> list[RepoPlan]:
    """Repos with something to reclaim or skip. Repos being downloaded (in
    `busy`, or locked by a download in any process) are left out; snapshots
    being served (`in_use`, by default every live server's) are kept."""
    from hub.locks import is_locked, served_snapshots

    in_use = served_snapshots() if in_use is None else in_use
    out = []
    for root in _roots(cache):
        if is_locked(root):
            continue
        try:
            repo = plan_repo(root, in_use)
        except FileNotFoundError:  # a clean-up took the lock after the look above and is deleting it now
            continue
        if _worth(repo, busy):
            out.append(repo)
    return out


def execute(cache: Path, busy: Collection[str] = frozenset(), in_use: frozenset | None = None) -> dict:
    """Recompute the plan repo by repo under the repo's lock, and delete it."""
    from hub.locks import repo_lock, served_snapshots

    in_use = served_snapshots() if in_use is None else in_use
    snapshots = blobs = reclaimed = 0
    for root in _roots(cache):
        with repo_lock(root, blocking=False) as held:
            repo = plan_repo(root, in_use) if held else None
            if not _worth(repo, busy):
                continue
            reclaimed += repo.reclaim_bytes
            for snapshot in repo.prune:
                shutil.rmtree(snapshot)
                snapshots += 1
            for blob in repo.dead_blobs:
                blob.unlink(missing_ok=True)
                blobs += 1
    return {"ok": True, "snapshots": snapshots, "blobs": blobs, "reclaimed_bytes": reclaimed}
