#!/usr/bin/env python
"""Dashboard WebSocket clients held by 1 vs 2 `hearth serve` web nodes on
one PostgreSQL and one Redis: C chat sockets are opened at once, dealt
round-robin to the nodes (as a load balancer would), all held open; then
each asks T short questions in a row (a tiny random llama, `max_tokens`
16). Reports how long opening all sockets took, turns answered per second
while every socket asks, the median / p95 time from a prompt to its
`turn_end`, how many turns a node refused because its generation queue was
full (64 waiting), and that every socket was still open at the end.

    .venv/bin/python bench/web_nodes.py [--clients 64] [--turns 3] [--record]

It starts its own PostgreSQL (Debian's, as the tests do: tests/pg.py) and
`redis-server` on free loopback ports, in a temporary folder. `--record`
appends the table, the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.jobs_workers import start_redis  # noqa: E402
from tests.helpers import TINY_REPO, ServerProcess, build_tiny_model, server_env  # noqa: E402
from tests.pg import Postgres  # noqa: E402


async def client(url: str, turns: int, latencies: list[float], go: asyncio.Event, opened: list,
                 refused: list) -> bool:
    import websockets

    async with websockets.connect(url, open_timeout=120, max_size=None) as ws:
        for _ in range(2):  # ready, sessions
            await ws.recv()
        await ws.send(json.dumps({"type": "set_sampling", "scope": "session", "temperature": 0, "max_tokens": 16}))
        opened.append(1)
        await go.wait()
        for n in range(turns):
            asked, error = time.perf_counter(), None
            await ws.send(json.dumps({"type": "prompt", "text": f"question {n}"}))
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 300))
                if frame["type"] == "error":
                    error = frame["message"]
                if frame["type"] == "turn_end":
                    break
            if error is None:
                latencies.append(time.perf_counter() - asked)
            elif "queue is full" in error:  # the engine's bound (64 waiting), answered as the contract says
                refused.append(error)
            else:
                raise RuntimeError(error)
        return ws.state.name == "OPEN"


async def run_once(urls: list[str], clients: int, turns: int) -> dict:
    latencies: list[float] = []
    go, opened, refused = asyncio.Event(), [], []
    started = time.perf_counter()
    tasks = [asyncio.ensure_future(client(urls[i % len(urls)].replace("http", "ws") + "/ws/chat", turns,
                                          latencies, go, opened, refused)) for i in range(clients)]
    while len(opened) < clients:
        if any(t.done() for t in tasks):
            for t in tasks:
                if t.done():
                    t.result()
        await asyncio.sleep(0.05)
    open_s = time.perf_counter() - started
    began = time.perf_counter()
    go.set()
    still_open = await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {"open_s": open_s, "turns_per_s": len(latencies) / elapsed, "p50": statistics.median(latencies),
            "p95": latencies[int(0.95 * (len(latencies) - 1))], "held": sum(still_open), "refused": len(refused)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hearth-bench-nodes-"))
    pg = Postgres()
    redis_proc, redis_url = start_redis(work)
    results = {}
    try:
        build_tiny_model(work / "hf" / "hub")
        for count in (1, 2):
            database = pg.create_database(f"bench{count}")
            nodes = []
            try:
                for n in range(count):
                    env = dict(server_env(work / "hf", work / f"home-{count}-{n}"), DATABASE_URL=database,
                               HEARTH_REDIS_URL=redis_url.rsplit("/", 1)[0] + f"/{count}")
                    env.setdefault("HEARTH_BLAS", "openblas")
                    nodes.append(ServerProcess(env, TINY_REPO, "--no-worker", log_path=work / f"node-{count}-{n}.log")
                                 .wait_ready())
                results[count] = asyncio.run(run_once([n.url for n in nodes], args.clients, args.turns))
            finally:
                for node in nodes:
                    node.stop()
    finally:
        redis_proc.terminate()
        redis_proc.wait()
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    table = ["| web nodes | sockets held | open all (s) | turns/s | turn p50 (s) | turn p95 (s) | refused |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for count, r in results.items():
        table.append(f"| {count} | {r['held']}/{args.clients} | {r['open_s']:.2f} | {r['turns_per_s']:.2f} | "
                     f"{r['p50']:.2f} | {r['p95']:.2f} | {r['refused']}/{args.clients * args.turns} |")
    print("\n".join(table))
    if args.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d')} · commit {commit} · WebSocket clients, 1 vs 2 web nodes\n\n"
                    f"`python bench/web_nodes.py --clients {args.clients} --turns {args.turns}` on "
                    f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; tiny random "
                    f"llama, `max_tokens` 16 per turn; nodes on one PostgreSQL and one Redis, sockets dealt "
                    f"round-robin.\n\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
