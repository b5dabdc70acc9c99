"""`hearth gc [--yes]`: show (and with --yes, delete) superseded snapshots
and dead blobs in the local HF cache."""
from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Reclaim disk from superseded revisions in the local Hugging Face cache."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--yes", action="store_true", help="delete what the plan lists (otherwise only show it)")

    def handle(self, *args, **opts):
        from django.core.management import call_command
        from huggingface_hub import constants

        from hub import gc
        from hub.api import _busy

        call_command("migrate", interactive=False, verbosity=0)
        cache = Path(constants.HF_HUB_CACHE)
        busy = _busy()
        repos = gc.plan(cache, busy)  # keeps what any live server has loaded
        if not repos:
            self.stdout.write("nothing to reclaim")
            return
        for repo in repos:
            r = repo.row()
            self.stdout.write(f"{r['repo_id']}: {r['prune_snapshots']} superseded snapshot(s), "
                              f"{r['dead_blobs']} dead blob(s), {r['reclaim_bytes']} bytes"
                              + (f"; {r['skipped_snapshots']} kept (they hold files the current revision lacks)"
                                 if r["skipped_snapshots"] else ""))
        if not opts["yes"]:
            self.stdout.write("run `hearth gc --yes` to delete this")
            return
        result = gc.execute(cache, busy)
        self.stdout.write(f"deleted {result['snapshots']} snapshot(s) and {result['blobs']} blob(s), "
                          f"{result['reclaimed_bytes']} bytes reclaimed")
