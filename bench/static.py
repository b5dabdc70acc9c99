#!/usr/bin/env python
"""Static files, measured: requests per second that one `hearth serve`
answers for the dashboard's files and the admin's, with a browser's
`Accept-Encoding: gzip, deflate, br`, and for a revalidation (the validator
of the first answer sent back: a 304), beside `/health` (a Django route) as
the yardstick. Each case runs for `--seconds` with `--concurrency`
keep-alive connections from one asyncio client (httpx) on this machine.

    .venv/bin/python bench/static.py [--seconds 3] [--concurrency 8] [--record]

The server runs the tests' tiny random llama (tests/helpers.py) with no
job worker, in throwaway HF_HOME and HEARTH_HOME, offline. The vendored
file is whichever highlight.js the shell (`/`) links. `--record` appends
the table, the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import TINY_REPO, ServerProcess, build_tiny_model, server_env  # noqa: E402

BROWSER = {"Accept-Encoding": "gzip, deflate, br"}


def cases(base: str) -> list[tuple[str, str, bool]]:
    """(label, path, revalidate) for each measured request."""
    import httpx

    shell = httpx.get(base + "/", headers=BROWSER).text
    vendored = re.search(r'src="(/assets/vendor/hljs[^"]*\.js)"', shell)
    assert vendored, "the shell links no vendored highlight.js"
    return [
        ("shell page `/`", "/", False),
        ("own module `/assets/js/main.js`", "/assets/js/main.js", False),
        ("own module, revalidated (304)", "/assets/js/main.js", True),
        (f"vendored `{vendored.group(1)}`", vendored.group(1), False),
        ("vendored, revalidated (304)", vendored.group(1), True),
        ("admin `/static/admin/css/base.css`", "/static/admin/css/base.css", False),
        ("API docs' `/static/ninja/swagger-ui-bundle.js` (1.5 MB)", "/static/ninja/swagger-ui-bundle.js", False),
        ("`/health` (Django JSON route)", "/health", False),
    ]


async def load(base: str, path: str, revalidate: bool, seconds: float, concurrency: int) -> dict:
    import httpx

    headers = dict(BROWSER)
    async with httpx.AsyncClient(base_url=base, limits=httpx.Limits(max_connections=concurrency),
                                 timeout=30) as client:
        first = await client.get(path, headers=headers)
        assert first.status_code == 200, (path, first.status_code)
        if revalidate:
            if "etag" in first.headers:
                headers["If-None-Match"] = first.headers["etag"]
            else:
                headers["If-Modified-Since"] = first.headers["last-modified"]
        statuses: dict[int, int] = {}
        wire = 0
        deadline = time.perf_counter() + seconds

        async def worker():
            nonlocal wire
            while time.perf_counter() < deadline:
                async with client.stream("GET", path, headers=headers) as r:
                    async for chunk in r.aiter_raw():
                        wire += len(chunk)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        took = time.perf_counter() - start
    done = sum(statuses.values())
    return {"rps": done / took, "bytes": wire / max(done, 1), "statuses": statuses,
            "encoding": first.headers.get("content-encoding", "identity"),
            "cache": first.headers.get("cache-control", "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hearth-bench-static-"))
    rows = []
    try:
        build_tiny_model(work / "hf" / "hub")
        server = ServerProcess(server_env(work / "hf", work / "home"), TINY_REPO, "--no-worker",
                               log_path=work / "serve.log").wait_ready()
        try:
            for label, path, revalidate in cases(server.url):
                r = asyncio.run(load(server.url, path, revalidate, args.seconds, args.concurrency))
                rows.append((label, r))
                print(label, r, flush=True)
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = ["| request | req/s | bytes on the wire | encoding | Cache-Control | answers |",
             "| --- | ---: | ---: | --- | --- | --- |"]
    for label, r in rows:
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))
        table.append(f"| {label} | {r['rps']:.0f} | {r['bytes']:.0f} | {r['encoding']} | {r['cache']} | {answers} |")
    print("\n".join(table))
    if args.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "config", "frontend"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d')} · commit {commit}{' (+ local changes)' if dirty else ''}"
                    f" · static files\n\n"
                    f"`python bench/static.py --seconds {args.seconds:g} --concurrency {args.concurrency} --record` "
                    f"on {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; one `hearth serve` "
                    f"on the tiny random llama, `--no-worker`; the client on the same machine.\n\n"
                    + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
