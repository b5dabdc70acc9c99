#!/usr/bin/env python
"""Greedy decode speed of one process holding a model against the same
model tensor-sharded across N ranks on this machine (`mlx.launch --backend
ring`, loopback), on bench/decode.py's ~100M-parameter random float32 llama.

    .venv/bin/python bench/sharded.py [--tokens 64] [--runs 3] [--ranks 2] [--threads 1] [--record]

Both run `hearth generate-sharded MODEL --json`; the numbers are its own
timings (prefill to the first token, then decode tokens/s), median of --runs.
`--threads N` gives each rank N BLAS threads (OpenBLAS and OpenMP) and the
single process N x ranks, so both use the same number of cores.
`--record` appends the table to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode import build_model, commit_label  # noqa: E402

LAUNCH = str(Path(sys.executable).with_name("mlx.launch"))
PROMPT = "Tell me a long story about a quiet house by the river."


def port_pair(n: int) -> int:
    """A port p with p .. p+n-1 free on loopback."""
    while True:
        port = random.randint(20000, 60000)
        try:
            for p in range(port, port + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue


def run_once(model: Path, ranks: int, tokens: int, env: dict) -> dict:
    command = [sys.executable, "-m", "hearth.cli", "generate-sharded", str(model), "--prompt", PROMPT,
               "--raw", "--max-tokens", str(tokens), "--json"]
    if ranks > 1:
        command = [LAUNCH, "--backend", "ring", "-n", str(ranks), "--starting-port", str(port_pair(ranks)), "--",
                   *command]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per rank (0: leave unset)")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hearth-bench-sharded-"))
    model = work / "model"
    params = build_model(model)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "_HEARTH_REEXEC")}
    env.update(HF_HUB_OFFLINE="1", HEARTH_HOME=str(work / "home"), HF_HOME=str(work / "hf"),
               HEARTH_BLAS=env.get("HEARTH_BLAS", "openblas"))
    rows = []
    for ranks in (1, args.ranks):
        threads = args.threads * (args.ranks if ranks == 1 else 1)
        if threads:
            env.update(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        runs = [run_once(model, ranks, args.tokens, env) for _ in range(args.runs)]
        rows.append((ranks, runs))
        time.sleep(1)
    base_tokens = rows[0][1][0]["tokens"]
    same = all(r["tokens"] == base_tokens for _, runs in rows for r in runs)
    threads_note = (f"BLAS threads: {args.threads * args.ranks} for the single process, {args.threads} per rank"
                    if args.threads else "default BLAS threads")
    base_tps = statistics.median(r["decode_tokens_per_second"] for r in rows[0][1])
    lines = [f"## {time.strftime('%Y-%m-%d')} · sharded (mx.distributed) · commit {commit_label()}", "",
             f"`python bench/sharded.py --tokens {args.tokens} --runs {args.runs} --ranks {args.ranks} "
             f"--threads {args.threads}{' --record' if args.record else ''}` on {platform.machine()}, "
             f"{os.cpu_count()} cores, {platform.python_version()}; random llama {params / 1e6:.0f}M params "
             f"float32, {args.tokens} greedy tokens, median of {args.runs}; {threads_note}.", "",
             "| processes | mode | decode tok/s | prefill s | vs 1 process |", "| ---: | --- | ---: | ---: | ---: |"]
    for ranks, runs in rows:
        tps = statistics.median(r["decode_tokens_per_second"] for r in runs)
        prefill = statistics.median(r["prompt_seconds"] for r in runs)
        lines.append(f"| {ranks} | {runs[0]['mode']} | {tps:.1f} | {prefill:.2f} | {tps / base_tps:.2f}x |")
    lines += ["", f"Same tokens in every run: {'yes' if same else 'NO'}.", ""]
    print("\n".join(lines))
    if args.record:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write("\n".join(lines) + "\n")
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
