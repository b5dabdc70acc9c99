"""`hearth rm MODEL [--yes]`: delete a model repo from the HF cache, every
revision of it (its `models--org--name` folder).

It asks first on a terminal; without one it wants `--yes`. It refuses a
model that a server is using: one a running server's `GET /models`
reports loaded or loading, or one whose snapshot a serving process on this
machine has recorded (hub.locks). The folder goes under the repo lock, so
a download or GC in another process is never raced: it is first renamed
out of the cache's `models--*` namespace in one step, so no scan ever sees
half a repo, then deleted. Every process's library listing turns over."""
from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from difflib import get_close_matches
from pathlib import Path

from django.core.management.base import BaseCommand

from hub.management import remote

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
EXIT_USAGE = 2


def disk_usage(root: Path) -> int:
    """Bytes the folder holds: each file once, links not followed."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            total += 0 if stat.S_ISLNK(st.st_mode) else st.st_size
    return total


def server_holds(model: str, server: remote.Server) -> bool:
    """Whether the running server, when one answers, has the model loaded or loading."""
    try:
        row = remote.find(server.models().get("data") or [], model)
    except remote.NoServer:
        return False
    except remote.ServerError as exc:
        sys.stderr.write(f"hearth rm: could not ask the server at {server.url} ({exc.status}: {exc}); "
                         f"going by the serving processes recorded on this machine\n")
        return False
    return row is not None and row.get("id") == model and remote.status_value(row) in remote.ACTIVE


def served_here(root: Path) -> bool:
    """Whether a serving process on this machine recorded a snapshot of the repo."""
    from hub.locks import served_snapshots

    return any(snapshot.is_relative_to(root) for snapshot in served_snapshots())


def confirmed(model: str, size: str) -> bool:
    try:
        answer = input(f"Remove {model} ({size})? [y/N] ")
    except (EOFError, KeyboardInterrupt):
        sys.stdout.write("\n")
        return False
    return answer.strip().lower() in ("y", "yes")


def unknown(model: str, cache: Path) -> str:
    repos = [d.name.removeprefix("models--").replace("--", "/") for d in cache.glob("models--*")]
    close = get_close_matches(model, repos, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"no model {model} in the local cache{hint} (`hearth ls` lists them)"


class Command(BaseCommand):
    help = "Remove a model repo (every revision) from the local Hugging Face cache."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("model", help="the repo id, org/name, as `hearth ls` shows it")
        parser.add_argument("--yes", "-y", action="store_true", help="remove without asking")
        remote.add_arguments(parser)

    def handle(self, *args, **opts):
        from huggingface_hub import constants

        from hub import library
        from hub.download import repo_dir
        from hub.locks import repo_lock

        model = opts["model"]
        cache = Path(constants.HF_HUB_CACHE).expanduser().resolve()
        root = repo_dir(cache, model)
        if not REPO_ID.fullmatch(model) or not root.is_dir():
            remote.fail("rm", unknown(model, cache))
        loaded = f"{model} is loaded; unload it first (POST /models/unload or the dashboard)"
        if server_holds(model, remote.Server.from_options(opts)) or served_here(root):
            remote.fail("rm", loaded)
        size = remote.human_size(disk_usage(root))
        if not opts["yes"]:
            if not sys.stdin.isatty():
                remote.fail("rm", f"stdin is not a terminal, so there is no one to ask; pass --yes to remove "
                                  f"{model} ({size})", EXIT_USAGE)
            if not confirmed(model, size):
                remote.fail("rm", f"kept {model}")
        with repo_lock(root, blocking=False) as held:
            if not held:
                remote.fail("rm", f"a download or GC in another process is using {model}; try again when it ends")
            if served_here(root):  # a server may have started on it meanwhile
                remote.fail("rm", loaded)
            doomed = cache / f".hearth-removing-{root.name}-{os.getpid()}"
            root.rename(doomed)  # out of every scan at once
            shutil.rmtree(doomed, ignore_errors=True)
        shutil.rmtree(cache / ".locks" / root.name, ignore_errors=True)  # huggingface_hub's own lock files
        library.mark_changed()
        self.stdout.write(f"removed {model} ({size})")
