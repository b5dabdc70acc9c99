"""`hearth memory init [PATH]`, `hearth memory status`, `hearth memory search Q`,
`hearth memory synthesize [--dry] [--vault NAME] [--url URL]`."""
from __future__ import annotations

import json
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from memory import git, index, service, vault


class Command(BaseCommand):
    help = "Memory vaults: set one up, search it, distill chat sessions into it."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        init = sub.add_parser("init", help="set up a vault (idempotent): folders, README, Meta pages, git")
        init.add_argument("path", nargs="?", help="inside HEARTH_HOME, the HF cache or a HEARTH_ALLOW_PATHS "
                                                  "folder (default: HEARTH_HOME/memory/<name>)")
        init.add_argument("--name", help="the vault's name (default: 'default', or the folder's name)")
        status = sub.add_parser("status", help="the vault's counts and recent articles")
        status.add_argument("--vault")
        search = sub.add_parser("search", help="full-text search of articles and Reference documents")
        search.add_argument("query")
        search.add_argument("--vault")
        search.add_argument("--limit", type=int, default=20)
        synth = sub.add_parser("synthesize", help="distill chat sessions changed since the last run into articles")
        synth.add_argument("--vault")
        synth.add_argument("--dry", action="store_true", help="plan the stages: no model calls, no writes")
        synth.add_argument("--url", default="http://127.0.0.1:8080",
                           help="the running `hearth serve` whose model does the work")

    def handle(self, *args, action, **opts):
        try:
            getattr(self, f"_{action}")(**opts)
        except (vault.VaultError, git.GitError) as exc:
            raise CommandError(str(exc)) from None

    def _vault(self, name):
        row = service.find(name)
        if row is None:
            raise CommandError(service.no_vault(name)["error"] + " (run `hearth memory init`)")
        return row

    def _init(self, path=None, name=None, **_):
        row, result = service.init(str(Path(path).absolute()) if path else None, name)
        state = "already set up" if result["already_set_up"] else "set up"
        self.stdout.write(f"vault {row.name!r} {state} at {row.root}" +
                          (f" (created: {', '.join(result['created'])})" if result["created"] else ""))

    def _status(self, vault=None, **_):
        row = self._vault(vault)
        self.stdout.write(json.dumps({"vault": row.row(), "status": service.vault.status(Path(row.root))}, indent=2))

    def _search(self, query, vault=None, limit=20, **_):
        row = self._vault(vault)
        found = index.search(Path(row.root), service.index_path(row.root), query, "all", max(1, min(limit, 200)))
        for hit in found["hits"]:
            where = f"{hit['article']}#{hit['anchor']}" if hit["anchor"] else hit["article"]
            self.stdout.write(f"{where}:{hit['line']}: {hit['excerpt']}")
        if not found["hits"]:
            self.stdout.write("no matches")

    def _synthesize(self, vault=None, dry=False, url=None, **_):
        from jobs import runner
        from jobs.models import Job
        from memory import synthesize

        row = self._vault(vault)
        if not dry:
            self._warn_of_a_demo(url)
        run = synthesize.start(row, dry, url)
        job = run.job
        self.stdout.write(f"synthesis job {job.id}: {run.session_count} session(s) to read")
        runner.run(job.id)  # here, unless a server's worker claimed it first; then follow it
        log, offset = job.event_log(), 0
        while True:
            events, offset = log.read(offset)
            for e in events:
                if e.get("type") in ("stage", "log"):
                    self.stdout.write(e.get("message") or e.get("stage") or "")
            job.refresh_from_db()
            if job.status in Job.TERMINAL and job.ended_at is not None:
                break
            time.sleep(0.5)
        for e in log.read(offset)[0]:
            if e.get("type") in ("stage", "log"):
                self.stdout.write(e.get("message") or "")
        if job.status != "done":
            raise CommandError(f"synthesis {job.status}: {job.error}")
        self.stdout.write(self.style.SUCCESS(f"synthesis done: {json.loads(job.message or '{}').get('note', '')}"))

    def _warn_of_a_demo(self, url: str) -> None:
        """The demo models can show that synthesis runs, not write articles worth keeping: said before a run,
        as the Memory page says it."""
        from jobs.llm import ServedModel
        from serving.demo.build import is_demo

        model = ServedModel(url, None).served_name()
        if model and is_demo(model):
            self.stderr.write(f"warning: the model served at {url}, {model}, is Hearth's tiny demo: the articles "
                              "it writes would be nonsense. Serve a real model (for example `hearth download "
                              "mlx-community/Qwen3-1.7B-4bit`, then `hearth serve` it) and synthesize with it.")
