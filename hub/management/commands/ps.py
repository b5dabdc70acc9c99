"""`hearth ps [--json]`: the models a running server holds, from its
`GET /models`: each loaded (or loading) model's state, the resident memory
of its process, how long it has been idle, whether it is pinned and how
many requests it is answering. With no server at the address it exits 1
and says how to start one."""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from hub.management import remote


def state(row: dict) -> str:
    """`loaded`, `loading 42%`, `unloading`, …"""
    raw = row.get("status")
    status = raw if isinstance(raw, dict) else {}
    value = remote.status_value(row)
    if status.get("unloading"):
        return "unloading"
    if value == "loading" and isinstance(status.get("percent"), (int, float)):
        return f"loading {int(status['percent'])}%"
    return value


def cells(row: dict) -> list[str]:
    inflight = row.get("inflight")
    return [str(row.get("id")), state(row), remote.human_size(row.get("memory_bytes")),
            remote.duration(row.get("idle_s")), "yes" if row.get("pinned") else "no",
            str(inflight) if isinstance(inflight, int) else remote.DASH]


class Command(BaseCommand):
    help = "List the models a running server has loaded: state, memory, idle time, pin, requests in flight."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the server's rows for those models as JSON")
        remote.add_arguments(parser)

    def handle(self, *args, **opts):
        server = remote.Server.from_options(opts)
        try:
            body = server.models()
        except remote.NoServer as exc:
            remote.fail("ps", f"{exc} (start one with hearth serve)" if exc.refused else str(exc))
        except remote.ServerError as exc:
            remote.fail("ps", f"the server at {server.url} answered {exc.status}: {exc}")
        rows = [row for row in body.get("data") or [] if remote.status_value(row) in remote.ACTIVE]
        if opts["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        headers = ["NAME", "STATUS", "MEMORY", "IDLE", "PINNED", "INFLIGHT"]
        self.stdout.write(remote.table(headers, [cells(row) for row in rows]), ending="")
