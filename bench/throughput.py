#!/usr/bin/env python
"""Throughput under concurrency, prompt-cache reuse and overload, side by
side: `mlx_lm.server` and `hearth serve` on one ~100M-parameter random
float32 llama, both on the same BLAS (`--blas`: OpenBLAS by default, or MKL or
BLIS when installed), in one run.

    .venv/bin/python bench/throughput.py [--tokens 64] [--record]

Legs, per server:
  load      streaming clients at concurrency 1, 8 and 32: aggregate tokens/s,
            median and p95 time to first token, errors
  prefix    a --prefix-tokens prompt (1,000) cold, then the same prefix with new endings
  chat      a 10-turn conversation replayed with the full history each turn
  flood     64 streaming clients at once, then 100 (beyond Hearth's queue)
Hearth also runs the prefix and chat legs with its prompt cache off, and the
load leg with mlx-lm's own SwiGLU (HEARTH_FAST_SWIGLU=0).

Every request suppresses special tokens and lone partial-UTF-8 byte tokens
with one logit_bias, so each decodes exactly --tokens of printable text.
`--record` appends the tables, the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode import build_model, commit_label, suppressed_ids, wait_up  # noqa: E402

WORDS = ("the river house quiet keeper light tower stone window garden morning evening bread tea letter "
         "road hill winter summer boat harbor lamp book chair table door field bird rain wind").split()


class Client:
    def __init__(self, port: int, model: str, suppress: list[int], tokens: int, prefix_words: int):
        self.port, self.model, self.tokens, self.prefix_words = port, model, tokens, prefix_words
        self.bias = {str(t): -100 for t in suppress}

    def chat(self, messages: list[dict], tokens: int | None = None) -> dict:
        """One streaming request: status, TTFT, tokens, reply text, or the failure."""
        body = {"model": self.model, "messages": messages, "max_tokens": tokens or self.tokens, "stream": True,
                "temperature": 0, "logit_bias": self.bias, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                resp.read()
                return {"status": resp.status}
            ttft, text, count, done, usage = None, [], 0, False, None
            while line := resp.readline():
                line = line.strip()
                if line == b"data: [DONE]":
                    done = True
                    break
                if not line.startswith(b"data:"):
                    continue
                chunk = json.loads(line[5:])
                usage = chunk.get("usage") or usage
                delta = ((chunk.get("choices") or [{}])[0].get("delta") or {})
                piece = delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")
                if piece:
                    ttft = ttft or time.perf_counter() - start
                    text.append(piece)
                    count += 1
            conn.close()
        except OSError as exc:  # reset, refused, timed out: the server dropped this client
            return {"status": "dropped", "error": type(exc).__name__}
        if not done:
            return {"status": "dropped", "error": "stream ended without [DONE]"}
        tokens_out = (usage or {}).get("completion_tokens") or count
        return {"status": 200, "ttft": ttft, "total": time.perf_counter() - start, "tokens": tokens_out,
                "prompt_tokens": (usage or {}).get("prompt_tokens"),
                "text": "".join(text), "cached": ((usage or {}).get("prompt_tokens_details") or {})
                .get("cached_tokens")}

    def crowd(self, n: int, concurrency: int, messages, tokens: int | None = None) -> tuple[list[dict], float]:
        gate, out, lock = threading.Semaphore(concurrency), [], threading.Lock()

        def one(i):
            with gate:
                result = self.chat(messages(i), tokens)
            with lock:
                out.append(result)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out, time.perf_counter() - start


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(round(q * (len(values) - 1))), len(values) - 1)] if values else float("nan")


def text_of(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def leg_load(client: Client, concurrency: int, n: int) -> dict:
    results, wall = client.crowd(n, concurrency, lambda i: [
        {"role": "user", "content": f"Story {i}: tell me about the {WORDS[i % len(WORDS)]} by the river."}])
    ok = [r for r in results if r["status"] == 200]
    ttfts = [r["ttft"] * 1000 for r in ok if r["ttft"]]
    return {"c": concurrency, "n": n, "ok": len(ok), "errors": n - len(ok),
            "agg_tok_s": sum(r["tokens"] for r in ok) / wall, "ttft_med_ms": statistics.median(ttfts),
            "ttft_p95_ms": _p(ttfts, 0.95)}


def leg_prefix(client: Client, seed: int) -> dict:
    prefix = text_of(client.prefix_words, seed)
    cold = client.chat([{"role": "user", "content": prefix + " Question one?"}], 4)
    warm = [client.chat([{"role": "user", "content": prefix + f" Question {w}?"}], 4)
            for w in ("two", "three", "four")]
    warm_ms = statistics.median(r["ttft"] * 1000 for r in warm)
    return {"cold_ms": cold["ttft"] * 1000, "warm_ms": warm_ms, "ratio": warm_ms / (cold["ttft"] * 1000),
            "cached": warm[-1].get("cached"), "prompt_tokens": cold.get("prompt_tokens")}


def leg_chat(client: Client, seed: int, turns: int = 10) -> dict:
    history = [{"role": "system", "content": "You are a patient storyteller. " + text_of(150, seed)}]
    ttfts, start = [], time.perf_counter()
    for turn in range(turns):
        history.append({"role": "user", "content": f"Turn {turn}: " + text_of(40, seed + turn + 1)})
        reply = client.chat(history, 24)
        ttfts.append(reply["ttft"] * 1000)
        history.append({"role": "assistant", "content": reply["text"]})
    return {"ttft_med_ms": statistics.median(ttfts), "ttft_last_ms": ttfts[-1], "ttft_sum_ms": sum(ttfts),
            "wall_s": time.perf_counter() - start}


def leg_flood(client: Client, n: int) -> dict:
    results, wall = client.crowd(n, n, lambda i: [{"role": "user", "content": f"Flood {i}: hello there."}], 16)
    statuses: dict[str, int] = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    return {"n": n, "statuses": statuses, "wall_s": wall}


def run_server(name, cmd, port, env, client: Client, legs: list[str], seed: int) -> dict:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    out = {}
    try:
        wait_up(port, proc)
        client.chat([{"role": "user", "content": "warm up"}], 8)
        if "load" in legs:
            out["load"] = [leg_load(client, 1, 4), leg_load(client, 8, 16), leg_load(client, 32, 32)]
            for row in out["load"]:
                print(f"{name:28} c={row['c']:<3} {row['agg_tok_s']:7.1f} tok/s  TTFT med {row['ttft_med_ms']:7.0f}"
                      f" p95 {row['ttft_p95_ms']:7.0f} ms  errors {row['errors']}", flush=True)
        if "prefix" in legs:
            out["prefix"] = leg_prefix(client, seed)
            p = out["prefix"]
            print(f"{name:28} prefix ({p['prompt_tokens']} prompt tokens) cold {p['cold_ms']:.0f} ms, "
                  f"warm {p['warm_ms']:.0f} ms ({p['ratio']:.2f}x)", flush=True)
        if "chat" in legs:
            out["chat"] = leg_chat(client, seed + 100)
            c = out["chat"]
            print(f"{name:28} chat TTFT med {c['ttft_med_ms']:.0f} ms, turn 10 {c['ttft_last_ms']:.0f} ms, "
                  f"wall {c['wall_s']:.1f}s", flush=True)
        if "flood" in legs:
            out["flood"] = [leg_flood(client, 64), leg_flood(client, 100)]
            for f in out["flood"]:
                print(f"{name:28} flood {f['n']}: {f['statuses']} in {f['wall_s']:.0f}s", flush=True)
    finally:
        proc.terminate()
        proc.wait(120)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=18531)
    parser.add_argument("--prefix-tokens", type=int, default=1000, help="length of the shared prefix leg")
    parser.add_argument("--legs", default="load,prefix,chat,flood", help="comma-separated legs to run")
    parser.add_argument("--blas", default="openblas", choices=("openblas", "mkl", "blis"),
                        help="the library preloaded for every server (default: %(default)s)")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    wanted = set(args.legs.split(","))

    work = Path(tempfile.mkdtemp(prefix="hearth-bench-"))
    model = work / "bench-llama-100m"
    params = build_model(model)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    suppress = suppressed_ids(model)
    print(f"model: {params / 1e6:.0f}M parameters, float32, at {model}", flush=True)
    prefix_words = 10
    while len(tok.encode(text_of(prefix_words, 0)).ids) < args.prefix_tokens:
        prefix_words += 10

    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "_HEARTH_REEXEC")}
    base.update(HF_HUB_OFFLINE="1", HEARTH_HOME=str(work / "home"), HF_HOME=str(work / "hf"))
    from core import blas as blas_lib

    chosen = {c.name: c for c in blas_lib.installed()}.get(args.blas)
    env = dict(blas_lib.preload_env(chosen, base), _HEARTH_REEXEC="1") if chosen else base
    blas = chosen.label if chosen else "reference"
    hearth = [sys.executable, "-m", "hearth.cli", "serve", str(model)]
    runs: list[tuple[str, list[str], list[str], dict]] = [
        ("mlx_lm.server", [sys.executable, "-m", "mlx_lm.server", "--model", str(model)], ["load", "prefix", "chat",
                                                                                         "flood"], {}),
        ("hearth serve", hearth, ["load", "prefix", "chat", "flood"], {}),
        # mlx-lm's own SwiGLU instead of the CPU one (inference/engine/fastmath.py)
        ("hearth serve, HEARTH_FAST_SWIGLU=0", hearth, ["load"], {"HEARTH_FAST_SWIGLU": "0"}),
        ("hearth serve, cache off", hearth + ["--prompt-cache-bytes", "0"], ["prefix", "chat"], {}),
    ]
    results = {}
    for i, (name, cmd, legs, extra) in enumerate(runs):
        legs = [leg for leg in legs if leg in wanted]
        if not legs:
            continue
        port = args.port + i
        client = Client(port, str(model), suppress, args.tokens, prefix_words)
        results[name] = run_server(name, cmd + ["--port", str(port)], port, {**env, **extra}, client, legs,
                                   seed=i * 1000)
    if args.record:
        record(args, params, blas, results)
    return 0


def record(args, params: int, blas: str, results: dict) -> None:
    commit = commit_label()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "inference", "config"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    lines = [
        f"\n## {time.strftime('%Y-%m-%d')} · throughput · commit {commit}{' (+ local changes)' if dirty else ''}\n",
        f"`python bench/throughput.py --tokens {args.tokens} --prefix-tokens {args.prefix_tokens} "
        f"--legs {args.legs} --blas {args.blas} --record` on {platform.machine()}, "
        f"{os.cpu_count()} cores; random llama {params / 1e6:.0f}M params float32, {blas} for every server.\n",
        "| server | concurrency | agg tok/s | TTFT med ms | TTFT p95 ms | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        for row in r.get("load", []):
            lines.append(f"| {name} | {row['c']} | {row['agg_tok_s']:.1f} | {row['ttft_med_ms']:.0f} | "
                         f"{row['ttft_p95_ms']:.0f} | {row['errors']} |")
    lines += ["", "| server | prefix tokens | prefix cold TTFT ms | warm ms | warm/cold |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        if "prefix" in r:
            p = r["prefix"]
            lines.append(f"| {name} | {p['prompt_tokens']} | {p['cold_ms']:.0f} | {p['warm_ms']:.0f} | "
                         f"{p['ratio']:.2f}x |")
    lines += ["", "| server | 10-turn chat TTFT med ms | turn 10 TTFT ms | chat wall s |",
              "| --- | ---: | ---: | ---: |"]
    for name, r in results.items():
        if "chat" in r:
            c = r["chat"]
            lines.append(f"| {name} | {c['ttft_med_ms']:.0f} | {c['ttft_last_ms']:.0f} | {c['wall_s']:.1f} |")
    lines += ["", "| server | clients at once | answers |", "| --- | ---: | --- |"]
    for name, r in results.items():
        for f in r.get("flood", []):
            lines.append(f"| {name} | {f['n']} | {', '.join(f'{k}: {v}' for k, v in sorted(f['statuses'].items()))} |")
    with open(ROOT / "bench" / "RESULTS.md", "a") as f:
        f.write("\n".join(lines) + "\n")
    print(f"recorded in {ROOT / 'bench' / 'RESULTS.md'}")


if __name__ == "__main__":
    sys.exit(main())
