"""`hearth download REPO [--revision R]`: fetch a model into the HF cache
with a progress bar; resumes partial files from an earlier attempt."""
from __future__ import annotations

import logging
import sys
import time

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GB"


class Command(BaseCommand):
    help = "Download a model repo from the Hugging Face Hub into the local cache, with progress."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("repo", help="org/name")
        parser.add_argument("--revision", default="main")

    def handle(self, *args, **opts):
        from hub import downloads
        from hub.download import check_revision

        if opts["verbosity"] <= 1:  # the bar and the last line say it all; -v 2 shows the requests and the log
            for name in ("httpx", "httpx2", "hearth.hub"):
                logging.getLogger(name).setLevel(logging.ERROR)

        call_command("migrate", interactive=False, verbosity=0)
        try:
            check_revision(opts["revision"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            row = downloads.create(opts["repo"], opts["revision"])
        except downloads.DuplicateDownload as exc:
            raise CommandError(str(exc)) from None
        shown = {"at": 0.0}

        def bar(p):
            now = time.monotonic()
            if now - shown["at"] < 0.2 and p.received_bytes < p.total_bytes:
                return
            shown["at"] = now
            done = p.received_bytes / p.total_bytes if p.total_bytes else 0.0
            filled = int(done * 30)
            line = (f"\r[{'#' * filled}{'.' * (30 - filled)}] {done * 100:5.1f}%  {_size(p.received_bytes)}"
                    f" / {_size(p.total_bytes)}  {_size(p.bytes_per_sec)}/s  files {p.files_done}/{p.files_total}"
                    f"  {p.current_file or ''}")
            sys.stderr.write(line[:160].ljust(160))
            sys.stderr.flush()

        try:
            row = downloads.run(row, report_extra=bar)
        except KeyboardInterrupt:  # Ctrl-C: the row says so; the partial files stay for the next run
            sys.stderr.write(f"\ninterrupted; `hearth download {row.repo_id}` again continues from the partial "
                             "files\n")
            sys.exit(130)
        sys.stderr.write("\n")
        if row.state != "done":
            # The sentence says what happened; the exception behind it (`detail`) only with -v 2.
            detail = f" ({row.detail})" if row.detail and opts["verbosity"] > 1 else ""
            raise CommandError(f"download of {row.repo_id} failed: {row.error}{detail}")
        self.stdout.write(f"{row.repo_id}@{row.commit} is in the local cache")
