#!/usr/bin/env python
"""Embeddings beside a chat stream: what `/v1/embeddings` requests cost a
client that only chats, and how fast they embed.

    .venv/bin/python bench/embeddings.py [--clients 1] [--inputs 2048] [--chars 1000]
        [--duration 0] [--port 8747] [--tree DIR] [--record]

`hearth serve MODEL --embeddings --no-worker` on the test suite's tiny model
(`tests/helpers.build_tiny_model`: 2 layers x 64, a 320-token BPE). A victim
streams a 16-token chat in a loop (each reply's total time and first token)
while `--clients` clients each send one embeddings request at once, of
`--inputs` strings of about `--chars` characters (random words, each string
its own). `--duration S` hangs the clients up after S seconds (to see what a
burst costs without waiting for all of it). Per run: the clients' status
codes, the embeddings throughput (inputs and tokens a second over the
requests answered 200), the victim's replies meanwhile, its worst total and
worst first token, and the serving process's resident memory before and at
its peak (sampled every 50 ms). `--tree DIR` runs `hearth` from another
checkout (an A/B of two commits on one machine). `--record` appends the
table, the command, the commit and the machine to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode import commit_label  # noqa: E402
from bench.device import listener, running  # noqa: E402

WORDS = ("river stone lantern meadow harbour copper violet orchard thunder willow "
         "candle saffron glacier pebble marble falcon cedar ember quill harvest").split()


def texts(n: int, chars: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(WORDS) + str(rng.randrange(100)))
        out.append(" ".join(words))
    return out


def victim(port: int, stop: threading.Event, out: list) -> None:
    """A 16-token streaming chat, again and again: each reply's total seconds and first-token seconds."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Tell me about the river."}],
                       "max_tokens": 16, "stream": True, "temperature": 0})
    while not stop.is_set():
        start = time.perf_counter()
        first = None
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            resp = conn.getresponse()
            while line := resp.readline():
                if first is None and line.startswith(b"data:"):
                    first = time.perf_counter() - start
            conn.close()
            out.append((time.perf_counter() - start, first or float("nan"), resp.status))
        except OSError as exc:
            out.append((time.perf_counter() - start, float("nan"), type(exc).__name__))


def attacker(port: int, payload: bytes, out: list, conns: list) -> None:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conns.append(conn)
    try:
        conn.request("POST", "/v1/embeddings", payload, {"content-type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        tokens = json.loads(data)["usage"]["prompt_tokens"] if resp.status == 200 else 0
        out.append((resp.status, time.perf_counter() - start, tokens))
    except (OSError, ValueError) as exc:
        out.append((type(exc).__name__, time.perf_counter() - start, 0))


def rss_sampler(proc, stop: threading.Event, peak: list) -> None:
    import psutil

    while not stop.is_set():
        try:
            peak[0] = max(peak[0], proc.memory_info().rss)
        except psutil.Error:
            return
        time.sleep(0.05)


def run(args, model: Path, work: Path) -> dict:
    tree = Path(args.tree).resolve() if args.tree else ROOT
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "_HEARTH_REEXEC")}
    env.update(HF_HUB_OFFLINE="1", HEARTH_HOME=str(work / "home"), HF_HOME=str(work / "hf"))
    cmd = [sys.executable, "-m", "hearth.cli", "serve", str(model), "--embeddings", "--no-worker",
           "--port", str(args.port)]
    payloads = [json.dumps({"model": "m", "input": texts(args.inputs, args.chars, seed=i),
                            "encoding_format": "float"}).encode() for i in range(args.clients)]
    with running(cmd, args.port, env, cwd=tree) as proc:
        server = listener(proc, args.port)
        stop, plain = threading.Event(), []
        warm = threading.Thread(target=victim, args=(args.port, stop, plain))
        warm.start()
        time.sleep(3)
        stop.set()
        warm.join()
        rss_before = server.memory_info().rss
        stop, replies, peak, done, conns = threading.Event(), [], [rss_before], [], []
        helpers = [threading.Thread(target=victim, args=(args.port, stop, replies)),
                   threading.Thread(target=rss_sampler, args=(server, stop, peak))]
        for t in helpers:
            t.start()
        time.sleep(1)
        start = time.perf_counter()
        clients = [threading.Thread(target=attacker, args=(args.port, p, done, conns)) for p in payloads]
        for t in clients:
            t.start()
        deadline = start + args.duration if args.duration else None
        for t in clients:
            t.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
        wall = time.perf_counter() - start
        for conn in conns:  # past --duration: the clients still waiting hang up
            if conn.sock is not None:
                conn.sock.shutdown(2)
        for t in clients:
            t.join()
        time.sleep(1)
        stop.set()
        for t in helpers:
            t.join()
    ok = [d for d in done if d[0] == 200]
    during = replies or [(float("nan"), float("nan"), "none")]
    return {"codes": Counter(str(d[0]) for d in done), "wall": wall,
            "inputs_s": len(ok) * args.inputs / wall if ok else 0.0,
            "tokens_s": sum(d[2] for d in ok) / wall if ok else 0.0,
            "plain_worst": max(r[0] for r in plain), "plain_median": statistics.median(r[0] for r in plain),
            "replies": len(replies), "worst": max(r[0] for r in during), "worst_ttft": max(r[1] for r in during),
            "victim_errors": sum(1 for r in during if r[2] != 200),
            "rss_before": rss_before / 2 ** 20, "rss_peak": peak[0] / 2 ** 20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--inputs", type=int, default=2048)
    parser.add_argument("--chars", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=0)
    parser.add_argument("--port", type=int, default=8747)
    parser.add_argument("--tree")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    from tests.helpers import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "models")
        r = run(args, model, work)
    failed = f" ({r['victim_errors']} failed)" if r["victim_errors"] else ""
    codes = ", ".join(f"{n} x {c}" for c, n in sorted(r["codes"].items()))
    lines = [f"{args.clients} client(s) x {args.inputs} strings of ~{args.chars} characters"
             f"{f', hung up after {args.duration:g} s' if args.duration else ''}; `hearth` from "
             f"{'this checkout' if not args.tree else Path(args.tree).name}", "",
             "| statuses | wall s | inputs/s | tokens/s | victim replies | victim worst s (first token) | "
             "victim alone: median, worst s | server RSS MiB: before, peak |",
             "|---|---|---|---|---|---|---|---|",
             f"| {codes} | {r['wall']:.1f} | {r['inputs_s']:.1f} | {r['tokens_s']:.0f} | {r['replies']}"
             f"{failed} | {r['worst']:.2f} "
             f"({r['worst_ttft']:.2f}) | {r['plain_median']:.2f}, {r['plain_worst']:.2f} | "
             f"{r['rss_before']:.0f}, {r['rss_peak']:.0f} |", ""]
    print("\n".join(lines))
    if args.record:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(f"\n`python bench/embeddings.py {' '.join(sys.argv[1:])}` · commit {commit_label()} · "
                    f"{platform.machine()}, {os.cpu_count()} cores · {time.strftime('%Y-%m-%d')}\n\n")
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
