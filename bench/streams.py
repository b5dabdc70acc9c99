#!/usr/bin/env python
"""Resumable streams, measured: what recording a stream (`X-Conversation-Id`:
the generation detached from the reply, every byte kept in memory and
written behind to disk) costs single-stream decode, beside a plain stream
of the same server, `mlx_lm.server` and raw mlx-lm; and how fast a finished
stream replays (`GET /v1/stream/{id}`, from memory and, after a restart,
from disk).

    .venv/bin/python bench/streams.py [--tokens 256] [--runs 5] [--record]

The model is bench/decode.py's ~100M-parameter random float32 llama, with
OpenBLAS preloaded when present. Plain and resumable runs alternate on one
server so drift on a busy machine hits both alike. `--record` appends the
table, the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import http.client
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode import (  # noqa: E402
    bench_args,
    build_model,
    commit_label,
    measure_raw,
    measure_server,
    preloaded_env,
    publish,
    stream_once,
    suppressed_ids,
    wait_up,
)


def replay(port: int, conversation: str) -> tuple[float, int]:
    """(seconds, bytes) to read a finished stream whole."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("GET", f"/v1/stream/{conversation}?from=0")
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    data = resp.read()
    took = time.perf_counter() - start
    conn.close()
    return took, len(data)


def main() -> int:
    args = bench_args(__doc__, tokens=256, runs=5, port=18631)

    work = Path(tempfile.mkdtemp(prefix="hearth-bench-streams-"))
    model = work / "bench-llama-100m"
    params = build_model(model)
    eos = suppressed_ids(model)
    env, blas = preloaded_env(work)
    print(f"model: {params / 1e6:.0f}M parameters, float32, {blas}", flush=True)

    raw = measure_raw(model, env, args.tokens, args.runs, eos)
    mlx_server = measure_server([sys.executable, "-m", "mlx_lm.server", "--model", str(model), "--port",
                                 str(args.port + 1)], args.port + 1, env, args.tokens, args.runs, eos, str(model))
    cmd = [sys.executable, "-m", "hearth.cli", "serve", str(model), "--no-worker", "--port", str(args.port)]
    rows: dict[str, list[dict]] = {"plain": [], "resumable": []}
    replays: dict[str, list[float]] = {"memory": [], "disk": []}
    conversations = []
    proc = subprocess.Popen(cmd, env=env, stdout=open(work / "serve.log", "wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_up(args.port, proc)
        stream_once(args.port, args.tokens, eos, str(model))  # warm-up
        for _ in range(args.runs):
            rows["plain"].append(stream_once(args.port, args.tokens, eos, str(model)))
            conversations.append(f"bench-{uuid.uuid4()}")
            rows["resumable"].append(stream_once(args.port, args.tokens, eos, str(model),
                                                 {"X-Conversation-Id": conversations[-1]}))
        time.sleep(1.0)  # written behind, and let go of in memory once nobody reads
        sizes = []
        for conversation in conversations:
            took, size = replay(args.port, conversation)
            replays["memory"].append(took)
            sizes.append(size)
        proc.terminate()
        proc.wait(120)
        proc = subprocess.Popen(cmd, env=env, stdout=open(work / "serve2.log", "wb"), stderr=subprocess.STDOUT,
                                cwd=ROOT)
        wait_up(args.port, proc)
        for conversation in conversations:
            replays["disk"].append(replay(args.port, conversation)[0])
    finally:
        proc.terminate()
        proc.wait(120)

    def med(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    table = {"raw mlx-lm stream_generate": raw, "mlx_lm.server": mlx_server, "hearth serve, plain stream":
             rows["plain"], "hearth serve, resumable (X-Conversation-Id)": rows["resumable"]}
    overhead = 100 * (1 - med(rows["resumable"], "tps") / med(rows["plain"], "tps"))
    commit = commit_label()
    lines = [
        f"\n## {time.strftime('%Y-%m-%d')} · resumable streams · commit {commit}\n",
        f"`python bench/streams.py --tokens {args.tokens} --runs {args.runs}` on {platform.machine()}, "
        f"{os.cpu_count()} cores, {platform.python_version()}, {blas}; random llama {params / 1e6:.0f}M params "
        f"float32, {args.tokens} tokens, median of {args.runs} (plain and resumable runs alternating).\n",
        "| runner | decode tok/s | TTFT ms |", "| --- | ---: | ---: |",
        *[f"| {name} | {med(runs, 'tps'):.1f} | {1000 * med(runs, 'ttft'):.0f} |" for name, runs in table.items()],
        f"\nRecording cost on decode: {overhead:+.1f}% (resumable vs plain on the same server).",
        f"Replay of a finished {statistics.median(sizes) / 1024:.0f} KiB stream: "
        f"{1000 * statistics.median(replays['memory']):.1f} ms (this process), "
        f"{1000 * statistics.median(replays['disk']):.1f} ms (after a restart, from HEARTH_HOME/streams).\n",
    ]
    publish(args, lines, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
