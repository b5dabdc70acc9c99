"""Git for vaults, always as an argument list (never a shell string).

Hearth commits as "Hearth <hearth@localhost>" so its changes are easy to
tell from the owner's own commits in `git log`."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from core import procs

IDENTITY = ["-c", "user.name=Hearth", "-c", "user.email=hearth@localhost", "-c", "commit.gpgsign=false",
            "-c", "core.hooksPath=/dev/null",  # a vault's hooks never run for Hearth
            "-c", "core.fsmonitor=false"]  # nor a command its config names to watch files
TIMEOUT_S = 60


class GitError(RuntimeError):
    pass


def run(root: Path, *args: str, check: bool = True, timeout: float = TIMEOUT_S) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    try:
        # Its own session: cancelling a job signals the job's process group, and a
        # fast-forward cut short there would leave the vault half checked out.
        done = procs.run(["git", "-C", str(root), *IDENTITY, *args], capture_output=True, text=True,
                         encoding="utf-8", errors="replace", env=env, hide=procs.SECRET_ENV, timeout=timeout,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    except FileNotFoundError:
        raise GitError("git is not installed (apt-get install git)") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} took over {timeout:.0f} s") from None
    if check and done.returncode != 0:
        raise GitError(f"git {args[0]} failed: {(done.stderr or done.stdout).strip()[:500]}")
    return done.stdout


def is_repo(root: Path) -> bool:
    """True when `root` is the top of its own work tree (not a folder inside another repository)."""
    if not (root / ".git").exists():
        return False
    try:
        top = run(root, "rev-parse", "--show-toplevel").strip()
    except GitError:
        return False
    return Path(top).resolve() == root.resolve()


def head(root: Path) -> str | None:
    out = run(root, "rev-parse", "--verify", "-q", "HEAD", check=False).strip()
    return out or None


def dirty(root: Path) -> list[str]:
    """Paths with uncommitted changes (untracked included)."""
    out = run(root, "status", "--porcelain", "-z", "--untracked-files=all")
    return [entry[3:] for entry in out.split("\0") if entry]


def commit_all(root: Path, message: str) -> str | None:
    """Stage everything and commit; None when there was nothing to commit."""
    run(root, "add", "-A")
    if not run(root, "status", "--porcelain").strip():
        return None
    run(root, "commit", "-q", "--no-verify", "-m", message)
    return head(root)
