#!/usr/bin/env python
"""Router mode, measured: the proxy's cost on single-stream decode (the
router forwarding to a model's process vs `hearth serve MODEL` answering
itself, with raw mlx-lm beside them), and the time to switch between two
models at `--models-max 1`, cold and warm (the prompt cache back from the
SSD tier).

    .venv/bin/python bench/router.py [--tokens 128] [--runs 5] [--record]

Both servers run the same ~100M-parameter random float32 llama as
bench/decode.py (two copies under one --models-dir for the switch), with
OpenBLAS preloaded when present. Decode runs alternate between the two
servers so drift on a busy machine hits both alike. `--record` appends the
tables, the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import http.client
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
sys.path.insert(0, str(ROOT / "bench"))

from decode import bench_args, build_model, measure_raw, preloaded_env, publish, stream_once, suppressed_ids, wait_up  # noqa: E402

LONG = [{"role": "user", "content": " ".join(f"Line {i}: the river runs past the quiet house." for i in range(120))}]


def post(port: int, path: str, body: dict, timeout: float = 600) -> tuple[int, dict, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    start = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read() or b"{}")
    return resp.status, data, time.perf_counter() - start


def long_prompt(port: int, model: str) -> tuple[float, int, int]:
    """(seconds to the answer of one token, prompt tokens, of which served from cache)."""
    status, data, took = post(port, "/v1/chat/completions", {"model": model, "messages": LONG, "max_tokens": 1})
    assert status == 200, data
    return took, data["usage"]["prompt_tokens"], data["usage"]["prompt_tokens_details"]["cached_tokens"]


def switch(port: int, model: str) -> float:
    status, data, took = post(port, "/models/load", {"model": model})
    assert status == 200 and data["status"]["value"] == "loaded", data
    return took


def start(cmd: list[str], port: int, env: dict, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    wait_up(port, proc)
    return proc


def main() -> int:
    args = bench_args(__doc__, tokens=128, runs=5, port=18531)

    work = Path(tempfile.mkdtemp(prefix="hearth-bench-router-"))
    models = work / "models"
    params = build_model(models / "m1")
    shutil.copytree(models / "m1", models / "m2")
    eos = suppressed_ids(models / "m1")
    env, blas = preloaded_env(work)
    print(f"model: {params / 1e6:.0f}M parameters, float32, {blas}", flush=True)

    raw = measure_raw(models / "m1", env, args.tokens, args.runs, eos)
    hearth = [sys.executable, "-m", "hearth.cli", "serve", "--no-worker"]
    single_port, router_port = args.port, args.port + 1
    single = start([*hearth, str(models / "m1"), "--port", str(single_port)], single_port, env, work / "single.log")
    router = start([*hearth, "--models-dir", str(models), "--default-model", "m1", "--models-max", "1",
                    "--port", str(router_port)], router_port, env, work / "router.log")
    try:
        switch(router_port, "m1")  # the default loads at start; wait for it
        rows: dict[str, list[dict]] = {"single": [], "router": []}
        for port, name in ((single_port, "m1"), (router_port, "m1")):
            stream_once(port, args.tokens, eos, name)  # warm-up
        for _ in range(args.runs):
            rows["single"].append(stream_once(single_port, args.tokens, eos, "m1"))
            rows["router"].append(stream_once(router_port, args.tokens, eos, "m1"))
        single.terminate()
        single.wait(60)
        switches = measure_switches(router_port)
    finally:
        for proc in (single, router):
            proc.terminate()
            proc.wait(120)
    decode = {name: {"tps": statistics.median(r["tps"] for r in runs),
                     "ttft_ms": 1000 * statistics.median(r["ttft"] for r in runs)} for name, runs in rows.items()}
    decode["raw"] = {"tps": statistics.median(r["tps"] for r in raw),
                     "ttft_ms": 1000 * statistics.median(r["ttft"] for r in raw)}
    lines = report(args, params, blas, decode, switches)
    publish(args, lines, work)
    return 0


def measure_switches(port: int) -> dict:
    """m1 is loaded; m2 has never been. Switch to m2 (cold: a new process, no
    prompt cache), ask the long prompt, switch back and forth again, ask it
    again (warm: the SSD tier kept m2's prompt cache across the unload)."""
    out = {"cold_switch_s": switch(port, "m2")}
    out["cold_prompt_s"], out["prompt_tokens"], out["cold_cached"] = long_prompt(port, "m2")
    out["back_switch_s"] = switch(port, "m1")
    out["warm_switch_s"] = switch(port, "m2")
    out["warm_prompt_s"], _, out["warm_cached"] = long_prompt(port, "m2")
    return out


def report(args, params: int, blas: str, decode: dict, sw: dict) -> list[str]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "uncommitted"
    overhead = 100 * (1 - decode["router"]["tps"] / decode["single"]["tps"])
    return [
        f"\n## {time.strftime('%Y-%m-%d')} · router mode · commit {commit}\n",
        f"`python bench/router.py --tokens {args.tokens} --runs {args.runs}` on {platform.machine()}, "
        f"{os.cpu_count()} cores, {platform.python_version()}, {blas}; random llama {params / 1e6:.0f}M params "
        f"float32, {args.tokens} tokens, median of {args.runs} (router and single runs alternating).\n",
        "| runner | decode tok/s | TTFT ms |", "| --- | ---: | ---: |",
        f"| raw mlx-lm stream_generate | {decode['raw']['tps']:.1f} | {decode['raw']['ttft_ms']:.0f} |",
        f"| hearth serve MODEL (single) | {decode['single']['tps']:.1f} | {decode['single']['ttft_ms']:.0f} |",
        f"| hearth serve (router -> child) | {decode['router']['tps']:.1f} | {decode['router']['ttft_ms']:.0f} |",
        f"\nProxy overhead on decode: {overhead:+.1f}% (router vs single; goal under 3%).\n",
        f"| switch at --models-max 1 | seconds | a {sw['prompt_tokens']}-token prompt to its first token | "
        "cached tokens |",
        "| --- | ---: | ---: | ---: |",
        f"| m1 -> m2, cold (new process, empty prompt cache) | {sw['cold_switch_s']:.2f} | "
        f"{sw['cold_prompt_s']:.2f} s | {sw['cold_cached']} |",
        f"| m2 -> m1 | {sw['back_switch_s']:.2f} | | |",
        f"| m1 -> m2, warm (prompt cache from the SSD tier) | {sw['warm_switch_s']:.2f} | "
        f"{sw['warm_prompt_s']:.2f} s | {sw['warm_cached']} |",
    ]


if __name__ == "__main__":
    sys.exit(main())
