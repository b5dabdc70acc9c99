"""`hearth ls [--json]`: the local model library as a table, one row per
model repo in the HF cache: its size, quantization, whether it fits this
machine (hub.library's verdict) and whether a running server has it
loaded. The last column comes from the server's `GET /models`; when no
server answers it shows `—` and one line on stderr says why. Reads the
cache only, never the network beyond that one request."""
from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand

from hub.management import remote

DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
LOADED = {"loaded": "yes", "loading": "loading"}  # any other state reads "no"


def quant(model) -> str:
    """`4-bit` for a quantized model, else the stored dtype (`bf16`), else `—`."""
    if model.quant_bits:
        return f"{model.quant_bits}-bit"
    dtype = model.config.get("torch_dtype") or model.config.get("dtype") or ""
    return DTYPES.get(str(dtype), str(dtype) or remote.DASH)


def served_rows(server: remote.Server) -> list[dict] | None:
    """The server's `GET /models` rows; None when no server answered, after
    one line on stderr."""
    try:
        return server.models().get("data") or []
    except remote.NoServer as exc:
        sys.stderr.write(f"hearth ls: {exc}, so LOADED shows {remote.DASH}\n")
    except remote.ServerError as exc:
        hint = "; pass --api-key or set HEARTH_API_KEY" if exc.status in (401, 403) else ""
        sys.stderr.write(f"hearth ls: the server at {server.url} answered {exc.status}: {exc}{hint}\n")
    return None


def served_states(rows: list[dict]) -> dict[str, str]:
    """Model id (and alias) -> the server's state for it."""
    states: dict[str, str] = {}
    for row in rows:
        for name in (row.get("id"), *(row.get("aliases") or ())):
            if name:
                states.setdefault(name, remote.status_value(row))
    return states


class Command(BaseCommand):
    help = "List the local models: size, quantization, whether each fits this machine and is loaded."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the rows as JSON")
        remote.add_arguments(parser)

    def handle(self, *args, **opts):
        from hub import library, registry

        machine = library.this_machine()  # measured once per HEARTH_HOME, then read back
        models = [(m, library.assessment(m, machine)) for m in registry.scan()]
        server = remote.Server.from_options(opts)
        served = served_rows(server)
        states = None if served is None else served_states(served)
        rows: list[dict[str, Any]] = []
        for model, assessment in models:
            fits = assessment.get("fits") if assessment else None
            state = None if states is None else states.get(model.repo_id, "unloaded")
            rows.append({"name": model.repo_id, "size_bytes": model.size_bytes, "quant": quant(model),
                         "fits": fits, "loaded": None if state is None else LOADED.get(state, "no")})
        if opts["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        cells = [[r["name"], remote.human_size(r["size_bytes"]), r["quant"],
                  {True: "yes", False: "no"}.get(r["fits"], "?"), r["loaded"] or remote.DASH] for r in rows]
        self.stdout.write(remote.table(["NAME", "SIZE", "QUANT", "FIT", "LOADED"], cells), ending="")
        if not rows and served:
            self._elsewhere(server, [str(row["id"]) for row in served if row.get("id")])
        elif not rows:
            sys.stderr.write("hearth ls: no models in the local cache yet (`hearth pull ORG/NAME` fetches one)\n")

    @staticmethod
    def _elsewhere(server: remote.Server, ids: list[str]) -> None:
        """The cache is empty but the server lists models: most often it reads
        another cache (it was started with another HF_HOME), so say which."""
        from huggingface_hub import constants

        names = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        sys.stderr.write(f"hearth ls: no models in this cache ({constants.HF_HUB_CACHE}), but the server at "
                         f"{server.url} lists {len(ids)} ({names}): it reads another cache (run with the "
                         "HF_HOME it was started with), or serves models from folders or other hosts\n")
