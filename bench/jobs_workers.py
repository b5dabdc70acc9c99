#!/usr/bin/env python
"""Jobs throughput with 1 vs 2 `hearth worker` processes on one Redis: N
small LoRA fine-tunes of a tiny random llama submitted at once to a web
node (`hearth serve --no-worker`), timed from the first submit until the
last job has ended; each worker takes one job at a time (`--workers 1`).

    .venv/bin/python bench/jobs_workers.py [--jobs 4] [--iters 30] [--record]

It starts its own `redis-server` (Debian's) on a free loopback port and
works in a temporary HEARTH_HOME and HF cache. `--record` appends the table,
the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tests.helpers import HEARTH, TINY_REPO, ServerProcess, build_tiny_model, free_port, server_env  # noqa: E402


def start_redis(folder: Path) -> tuple[subprocess.Popen, str]:
    import redis

    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(200):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not answer")


def run_once(env: dict, url: str, workers: int, jobs: int, iters: int, data: Path, work: Path) -> float:
    import redis

    client = redis.Redis.from_url(env["HEARTH_REDIS_URL"])
    procs = []
    for i in range(workers):
        proc = subprocess.Popen([*HEARTH, "worker", "--workers", "1"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=dict(env, HEARTH_WORKER_HOST=f"bench-{i}"))
        procs.append(proc)
        while not client.exists(f"hearth:worker:bench-{i}:{proc.pid}"):
            time.sleep(0.1)
    try:
        start = time.perf_counter()
        ids = [httpx.post(url + "/api/finetune/submit", json={
            "model_dir": TINY_REPO, "data_dir": str(data), "adapter_path": str(work / f"a-{workers}-{n}"),
            "iters": iters, "batch_size": 2, "rank": 4, "steps_per_report": iters}).json()["job_id"]
            for n in range(jobs)]
        while True:
            rows = [httpx.get(f"{url}/api/jobs/{i}").json()["job"] for i in ids]
            if all(r["ended_at"] for r in rows):
                break
            time.sleep(0.2)
        elapsed = time.perf_counter() - start
        assert all(r["status"] == "done" for r in rows), rows
        return elapsed
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hearth-bench-jobs-"))
    redis_proc, redis_url = start_redis(work)
    node = None
    try:
        build_tiny_model(work / "hf" / "hub")
        data = work / "data"
        data.mkdir()
        row = json.dumps({"messages": [{"role": "user", "content": "Say it."},
                                       {"role": "assistant", "content": "It."}]})
        (data / "train.jsonl").write_text("\n".join([row] * 8) + "\n")
        (data / "valid.jsonl").write_text("\n".join([row] * 2) + "\n")
        env = dict(server_env(work / "hf", work / "home"), HEARTH_REDIS_URL=redis_url,
                   HEARTH_ALLOW_PATHS=str(work))
        env.setdefault("HEARTH_BLAS", "openblas")
        node = ServerProcess(env, TINY_REPO, "--no-worker", log_path=work / "node.log").wait_ready()
        results = {n: run_once(env, node.url, n, args.jobs, args.iters, data, work) for n in (1, 2)}
    finally:
        if node is not None:
            node.stop()
        redis_proc.terminate()
        redis_proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    table = ["| workers | jobs | seconds | jobs per minute |", "| ---: | ---: | ---: | ---: |"]
    for n, seconds in results.items():
        table.append(f"| {n} | {args.jobs} | {seconds:.1f} | {args.jobs * 60 / seconds:.1f} |")
    print("\n".join(table))
    if args.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d')} · commit {commit} · jobs throughput, 1 vs 2 workers on Redis\n\n"
                    f"`python bench/jobs_workers.py --jobs {args.jobs} --iters {args.iters}` on "
                    f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; tiny random "
                    f"llama (2 layers, 64 wide), LoRA rank 4, {args.iters} iterations of batch 2 per job; "
                    f"each worker `--workers 1`, one Redis, one HEARTH_HOME.\n\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
