"""`hearth blas`: the BLAS libraries installed here, their measured speed,
and the one a start picks (core.blas). `--measure` measures again."""
from __future__ import annotations

import json
import os
import sys
import time

from django.core.management.base import BaseCommand

from core import blas
from core.home import blas_cache


class Command(BaseCommand):
    help = "Show the BLAS libraries installed here, their measured GFLOP/s, and which one `hearth` starts on."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--measure", action="store_true",
                            help="measure every installed library again now and cache the result (a few seconds)")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the cached measurement as JSON")

    def handle(self, *args, measure: bool, as_json: bool, **options):
        if sys.platform != "linux":
            self.stdout.write("MLX uses Accelerate on macOS; there is no BLAS to choose.")
            return
        candidates = blas.installed()
        path = blas_cache()
        record = None if measure else blas.read_cache(path, blas.cache_key(candidates))
        if record is None:
            self.stderr.write("measuring the BLAS libraries installed here...")
            record = blas.measure_all(candidates, path)
        if as_json:
            self.stdout.write(json.dumps(record, indent=1))
            return
        self.stdout.write(f"BLAS libraries on this machine ({blas.cpu_model()}, {os.cpu_count()} cores), "
                          "MLX float32 GFLOP/s against a 2048 x 2048 weight:")
        self.stdout.write(f"    {'name':10} {'score':>7}  {'M=1':>7} {'M=8':>7} {'M=32':>7}  library")
        for r in sorted(record["results"], key=lambda r: -r["score"]):
            mark = "*" if r["name"] == record["best"] else " "
            if r["ok"]:
                rates = " ".join(f"{r['gflops'].get(str(m), 0):7.1f}" for m, _, _ in blas.SHAPES)
                self.stdout.write(f"  {mark} {r['name']:10} {r['score']:7.1f}  {rates}  {r['library'] or '(bundled)'}")
            else:
                self.stdout.write(f"  {mark} {r['name']:10} rejected: {r['error']}")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["measured_at"]))
        self.stdout.write(f"measured {when} in {record.get('seconds', '?')} s, cached in {path}. "
                          "Score: the geometric mean of the three rates.")
        if (record.get("others_cpu") or 0) > blas.BUSY:
            self.stdout.write(f"Other processes used {record['others_cpu']:.0%} of the CPU meanwhile, so the rates "
                              "may be low; `hearth blas --measure` on a quiet machine measures again.")
        forced = os.environ.get("HEARTH_BLAS", "").strip().lower()
        if forced and forced != "auto":
            self.stdout.write(f"HEARTH_BLAS={forced} is set: a start uses {forced}, not the measurement.")
        else:
            self.stdout.write(f"A start picks {record['best'] or 'the fallback (OpenBLAS)'}; "
                              "`--blas NAME` or HEARTH_BLAS=NAME overrides it.")

