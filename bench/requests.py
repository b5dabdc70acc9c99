#!/usr/bin/env python
"""What a request costs Hearth beside its tokens: bursts of short requests
through `hearth serve`, and the prompt cache's lookup and publish by the
number of entries it holds.

    .venv/bin/python bench/requests.py [--legs burst,cache] [--concurrency 32]
        [--rounds 30] [--tree DIR] [--record]

burst   `hearth serve` on a 2-layer x 256 float32 llama built here (the model's
        compute is small, so the serving path shows), `--rounds` bursts of C
        streaming requests for 2 tokens each, every prompt new (so the prompt
        cache grows by C entries a burst, as on a server that has run a while).
        Per burst: the median and the last first token, and the wall time;
        over all of them the server's CPU per request, and its event loop's
        (daphne, Django, the protocol) alone. `--tree DIR` runs `hearth`
        from another checkout of Hearth (an A/B of two commits on one machine).
cache   `PromptCache` in this process, holding N entries of a shared
        40-token system prompt, 20 tokens of their own and 64 generated: the
        time of one lookup of a new conversation, and of one publish.
`--record` appends the tables, the command, the commit and the date to
bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode import commit_label, suppressed_ids  # noqa: E402
from bench.device import build, cpu_seconds, listener, one_stream, running, timed  # noqa: E402


def burst_leg(args, work: Path) -> list[str]:
    model = build("medium", work, quick=True)
    bias = {str(i): -100 for i in suppressed_ids(model)}
    tree = Path(args.tree).resolve() if args.tree else ROOT
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "_HEARTH_REEXEC")}
    env.update(HF_HUB_OFFLINE="1", HEARTH_HOME=str(work / "home"), HF_HOME=str(work / "hf"))
    cmd = [sys.executable, "-m", "hearth.cli", "serve", str(model), "--port", str(args.port), "--no-worker"]

    def burst(k: int) -> tuple[float, float, float]:
        out: list[dict] = []
        wall = timed([threading.Thread(target=one_stream, args=(args.port, str(model), 1000 * k + i, 2, bias, out))
                      for i in range(args.concurrency)])
        firsts = [r["ttft"] for r in out if "ttft" in r]
        if len(firsts) < args.concurrency:
            raise SystemExit(f"burst {k}: {args.concurrency - len(firsts)} requests failed: {out}")
        return statistics.median(firsts), max(firsts), wall

    with running(cmd, args.port, env, cwd=tree) as proc:
        for k in range(3):  # warm-up
            burst(k)
        server = listener(proc, args.port)
        before, runs = cpu_seconds(server), []
        for k in range(args.rounds):
            runs.append(burst(10 + k))
            time.sleep(0.2)
        after = cpu_seconds(server)
    n = args.rounds * args.concurrency
    cell = [statistics.median(r[i] for r in runs) * 1000 for i in range(3)]
    return [f"**burst** ({args.rounds} bursts of {args.concurrency} new prompts, 2 tokens each; `hearth` from "
            f"{'this checkout' if not args.tree else tree.name})", "",
            "| median first token ms | last first token ms | burst wall ms | server CPU ms / request | "
            "its event loop ms / request |", "|---|---|---|---|---|",
            f"| {cell[0]:.0f} | {cell[1]:.0f} | {cell[2]:.0f} | {1000 * (after[0] - before[0]) / n:.1f} | "
            f"{1000 * (after[1] - before[1]) / n:.2f} |", ""]


def cache_leg(args) -> list[str]:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from inference.engine.prompt_cache import PromptCache

    def kv(n: int) -> list:
        c = KVCache()
        x = mx.zeros((1, 1, n, 8))
        c.update_and_fetch(x, x)
        return [c]

    rng = random.Random(1)
    system = [rng.randrange(1000) for _ in range(40)]

    def conversation() -> list[int]:
        return system + [rng.randrange(1000) for _ in range(20)]

    table = ["**cache** (`PromptCache`, in this process)", "", "| entries | lookup us | publish us |", "|---|---|---|"]
    for n in (100, 1000, 3000):
        cache = PromptCache(1 << 40)
        for _ in range(n):
            tokens = conversation() + [rng.randrange(1000) for _ in range(64)]
            cache.publish(tokens, kv(len(tokens)))
        asked = [conversation() for _ in range(200)]
        start = time.perf_counter()
        for tokens in asked:
            cache.lookup(tokens)
        lookup = (time.perf_counter() - start) / len(asked)
        kept = [tokens + [rng.randrange(1000) for _ in range(64)] for tokens in asked]
        caches = [kv(len(tokens)) for tokens in kept]
        start = time.perf_counter()
        for tokens, c in zip(kept, caches, strict=True):
            cache.publish(tokens, c)
        publish = (time.perf_counter() - start) / len(kept)
        table.append(f"| {n} | {1e6 * lookup:.0f} | {1e6 * publish:.0f} |")
    return [*table, ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legs", default="burst,cache")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--port", type=int, default=18562)
    parser.add_argument("--tree", help="run `hearth` from this checkout of Hearth instead of this one")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hearth-bench-requests-"))
    lines = [f"\n## bench/requests.py: {time.strftime('%Y-%m-%d')}, commit {commit_label()}, {platform.machine()}",
             f"`{' '.join(['bench/requests.py', *sys.argv[1:]])}`", ""]
    legs = args.legs.split(",")
    if "burst" in legs:
        lines += burst_leg(args, work)
    if "cache" in legs:
        lines += cache_leg(args)
    print("\n".join(lines), flush=True)
    if args.record:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
