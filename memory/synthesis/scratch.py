"""Where a synthesis run writes: a git worktree of the vault in a scratch
folder. A stage's changes become one commit there, and the vault's branch
is fast-forwarded to it only when the stage has succeeded, so the vault's
own folder only ever moves from one good commit to the next."""
from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

from memory import git


class ScratchError(RuntimeError):
    pass


def _lock(vault: Path):
    """The vault's synthesis lock, held (an open file), or None while another run holds it."""
    handle = open(vault / ".git" / "hearth-synthesis.lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _unlock(handle) -> None:
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()


def _remove_trees(vault: Path, folder: Path) -> None:
    if folder.is_dir():
        for stale in folder.iterdir():
            shutil.rmtree(stale, ignore_errors=True)
    git.run(vault, "worktree", "prune", check=False)


def clear_abandoned(vault_root: Path, scratch_root: Path) -> bool:
    """What a run that never finished left (its process was killed): the
    scratch worktrees and search index of this vault. Nothing in them had
    landed. Skipped while another synthesis holds the vault; True when cleared."""
    vault, folder = Path(vault_root), Path(scratch_root)
    if not git.is_repo(vault):
        return False
    handle = _lock(vault)
    if handle is None:
        return False
    try:
        _remove_trees(vault, folder)
        for index in folder.parent.glob("*.index.sqlite3"):
            index.unlink(missing_ok=True)
    finally:
        _unlock(handle)
    return True


class Scratch:
    def __init__(self, vault_root: Path, scratch_root: Path, key: str, log):
        self.vault, self.folder, self.log = Path(vault_root), Path(scratch_root), log
        self.path = self.folder / key
        self.base: str | None = None
        self._lock = None

    def __enter__(self) -> Scratch:
        if not git.is_repo(self.vault) or git.head(self.vault) is None:
            raise ScratchError(f"{self.vault} is not a vault with a first commit; run `hearth memory init`")
        self._lock = _lock(self.vault)
        if self._lock is None:
            raise ScratchError("another synthesis is running on this vault")
        edited = git.dirty(self.vault)
        if edited:  # the owner's own edits are kept as their own commit before Hearth changes anything
            commit = git.commit_all(self.vault, "Edits made outside Hearth")
            self.log(f"committed {len(edited)} file(s) edited outside Hearth as {commit[:10]}")
        self._clear_stale()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        git.run(self.vault, "worktree", "add", "--detach", "-q", str(self.path), "HEAD")
        self.base = git.head(self.vault)
        return self

    def _clear_stale(self) -> None:
        """Worktrees left by a run that was killed: remove them (nothing in them had landed)."""
        _remove_trees(self.vault, self.folder)

    def land(self, message: str) -> str | None:
        """Commit the stage's changes and move the vault to that commit; None when nothing changed."""
        commit = git.commit_all(self.path, message)
        if commit is None:
            return None
        if git.head(self.vault) != self.base:
            raise ScratchError("the vault got a new commit while synthesis ran; run it again")
        git.run(self.vault, "merge", "--ff-only", "-q", commit)
        self.base = commit
        return commit

    def __exit__(self, *exc) -> None:
        try:
            git.run(self.vault, "worktree", "remove", "--force", str(self.path), check=False)
            shutil.rmtree(self.path, ignore_errors=True)
            git.run(self.vault, "worktree", "prune", check=False)
        finally:
            if self._lock is not None:
                _unlock(self._lock)
