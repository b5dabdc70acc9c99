#!/usr/bin/env python
"""Soak: many clients for a long time, watching the server for leaks.

    .venv/bin/python bench/soak.py [--minutes 30] [--clients 16] [--record]

Starts `hearth serve --embeddings` on the demo model (or uses --url) and
runs --clients concurrent clients for --minutes. Each client cycles through
a mix: OpenAI chat streams, a non-streamed chat offering tools, JSON-schema
and guided_choice grammar requests, streams dropped after a few chunks
(the client leaves mid-stream), text completions, Anthropic Messages
(streamed and not), Responses (streamed and not, with a continuation) and
embeddings. Every 10 s it samples the server process tree: RSS, open file
descriptors and threads. It reports the errors (any answer but a 200, and
any stream that ended without its final event), the request counts per
kind, and RSS / fds / threads after warm-up against the end of the run.
`--record` appends the table, the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.device import running  # noqa: E402

WORDS = "lighthouse keeper tide harbor lamp winter boat storm rope gull stone bread tea letter".split()
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}}]


def _prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))) + "?"


class Soak:
    def __init__(self, url: str, minutes: float, clients: int, max_tokens: int):
        self.url, self.clients, self.max_tokens = url, clients, max_tokens
        self.deadline = time.monotonic() + minutes * 60
        self.counts: Counter = Counter()
        self.errors: list[str] = []
        self.lock = threading.Lock()

    # -- one request of each kind; each returns None or an error string ----------
    def _sse(self, client: httpx.Client, path: str, body: dict, done_marker: str | tuple,
             abort_after: int | None = None):
        with client.stream("POST", self.url + path, json=body) as r:
            if r.status_code != 200:
                return f"{path} {r.status_code} {r.read()[:200]!r}"
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: ") or line.startswith("event: "):
                    seen += 1
                    if any(m in line for m in ((done_marker,) if isinstance(done_marker, str) else done_marker)):
                        return None
                    if abort_after is not None and seen >= abort_after:
                        return None  # the client leaves mid-stream
            return None if abort_after is not None else f"{path} stream ended without {done_marker}"

    def _post(self, client: httpx.Client, path: str, body: dict):
        r = client.post(self.url + path, json=body)
        return None if r.status_code == 200 else f"{path} {r.status_code} {r.text[:200]}"

    def one(self, client: httpx.Client, kind: str, rng: random.Random):
        messages = [{"role": "user", "content": _prompt(rng)}]
        cap = {"max_tokens": rng.randint(4, self.max_tokens)}
        if kind == "stream":
            return self._sse(client, "/v1/chat/completions", {"messages": messages, "stream": True, **cap}, "[DONE]")
        if kind == "abort":
            return self._sse(client, "/v1/chat/completions", {"messages": messages, "stream": True,
                                                              "max_tokens": self.max_tokens}, "[DONE]",
                             abort_after=rng.randint(1, 4))
        if kind == "tools":
            return self._post(client, "/v1/chat/completions", {"messages": messages, "tools": TOOLS, **cap})
        if kind == "schema":
            return self._post(client, "/v1/chat/completions", {"messages": messages, "max_tokens": 48,
                                                               "response_format": {"type": "json_schema",
                                                                                   "json_schema": {
                                                                                       "name": "p",
                                                                                       "schema": SCHEMA}}})
        if kind == "choice":
            return self._post(client, "/v1/chat/completions", {"messages": messages, "max_tokens": 8,
                                                               "guided_choice": ["yes", "no", "maybe"]})
        if kind == "completion":
            return self._post(client, "/v1/completions", {"prompt": _prompt(rng), **cap})
        if kind == "anthropic":
            return self._post(client, "/v1/messages", {"messages": messages, **cap})
        if kind == "anthropic_stream":
            return self._sse(client, "/v1/messages", {"messages": messages, "stream": True, **cap}, "message_stop")
        if kind == "responses":
            r = client.post(self.url + "/v1/responses", json={"input": _prompt(rng), "max_output_tokens": 12})
            if r.status_code != 200:
                return f"/v1/responses {r.status_code} {r.text[:200]}"
            return self._post(client, "/v1/responses", {"input": _prompt(rng), "max_output_tokens": 8,
                                                        "previous_response_id": r.json()["id"]})
        if kind == "responses_stream":
            return self._sse(client, "/v1/responses", {"input": _prompt(rng), "stream": True, "max_output_tokens": 12},
                             ("response.completed", "response.incomplete"))
        if kind == "embeddings":
            return self._post(client, "/v1/embeddings", {"input": [_prompt(rng) for _ in range(rng.randint(1, 4))]})
        raise ValueError(kind)

    KINDS = ("stream", "abort", "tools", "schema", "choice", "completion", "anthropic", "anthropic_stream",
             "responses", "responses_stream", "embeddings")

    def client(self, n: int) -> None:
        rng = random.Random(n)
        with httpx.Client(timeout=300) as client:
            i = n
            while time.monotonic() < self.deadline:
                kind = self.KINDS[i % len(self.KINDS)]
                i += 1
                try:
                    error = self.one(client, kind, rng)
                except httpx.HTTPError as exc:
                    error = f"{kind}: {type(exc).__name__}: {exc}"
                with self.lock:
                    self.counts[kind] += 1
                    if error:
                        self.errors.append(error)

    def run(self, pid: int) -> list[dict]:
        threads = [threading.Thread(target=self.client, args=(n,), daemon=True) for n in range(self.clients)]
        for t in threads:
            t.start()
        samples, started = [], time.monotonic()
        while any(t.is_alive() for t in threads):
            samples.append({**sample(pid, time.monotonic() - started, sum(self.counts.values()), len(self.errors)),
                            **caches(self.url)})
            print(json.dumps(samples[-1]), flush=True)
            for t in threads:
                t.join(timeout=10 / len(threads))
        samples.append(sample(pid, time.monotonic() - started, sum(self.counts.values()), len(self.errors)))
        return samples


def sample(pid: int, elapsed: float, requests: int, errors: int) -> dict:
    """RSS, fds and threads of the server and its children (the job worker, template workers)."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    rss = fds = threads = 0
    for p in procs:
        try:
            rss += p.memory_info().rss
            fds += p.num_fds()
            threads += p.num_threads()
        except psutil.Error:
            continue
    server = root.memory_info().rss
    return {"t_s": round(elapsed), "server_rss_mb": round(server / 2**20, 1), "tree_rss_mb": round(rss / 2**20, 1),
            "server_fds": root.num_fds(), "tree_fds": fds, "server_threads": root.num_threads(),
            "tree_threads": threads, "requests": requests, "errors": errors}


def caches(url: str) -> dict:
    """What the server holds on purpose (bounded caches), to read RSS against."""
    try:
        stats = httpx.get(url + "/stats", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {}
    mb = 2**20
    return {"prompt_cache_mb": round(stats.get("prompt_cache", {}).get("bytes", 0) / mb, 1),
            "response_store_mb": round(stats.get("response_store", {}).get("bytes", 0) / mb, 1),
            "grammar_cache_mb": round(stats.get("grammar", {}).get("bytes", 0) / mb, 1),
            "mlx_active_mb": round(stats.get("engine", {}).get("mlx_memory", {}).get("active_bytes", 0) / mb, 1)}


def summary(samples: list[dict], warmup_s: float) -> dict:
    after = [s for s in samples if s["t_s"] >= warmup_s] or samples
    first, last = after[0], samples[-1]
    return {"warm_at_s": first["t_s"], "end_s": last["t_s"],
            "server_rss_mb": (first["server_rss_mb"], last["server_rss_mb"],
                              max(s["server_rss_mb"] for s in after)),
            "server_fds": (first["server_fds"], last["server_fds"], max(s["server_fds"] for s in after)),
            "server_threads": (first["server_threads"], last["server_threads"],
                               max(s["server_threads"] for s in after)),
            "tree_rss_mb": (first["tree_rss_mb"], last["tree_rss_mb"], max(s["tree_rss_mb"] for s in after))}


def record(args, soak: Soak, result: dict, samples: list[dict]) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    rows = "\n".join(f"| {s['t_s']} | {s['server_rss_mb']} | {s['tree_rss_mb']} | {s['server_fds']} | "
                     f"{s['server_threads']} | {s['requests']} | {s['errors']} |" for s in samples[::6] + samples[-1:])
    counts = ", ".join(f"{k} {v}" for k, v in sorted(soak.counts.items()))
    text = (f"\n## Soak, {time.strftime('%Y-%m-%d')} (commit {commit})\n\n"
            f"`.venv/bin/python bench/soak.py --minutes {args.minutes:g} --clients {args.clients} "
            f"--max-tokens {args.max_tokens}` on the demo model, this machine ({os.cpu_count()} cores).\n\n"
            f"Requests {sum(soak.counts.values())} ({counts}); errors {len(soak.errors)}.\n"
            f"After warm-up (t = {result['warm_at_s']} s) to the end (t = {result['end_s']} s), first / last / "
            f"max: server RSS {result['server_rss_mb']} MB, process tree RSS {result['tree_rss_mb']} MB, "
            f"server fds {result['server_fds']}, server threads {result['server_threads']}.\n\n"
            "| t (s) | server RSS (MB) | tree RSS (MB) | fds | threads | requests | errors |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n" + rows + "\n")
    with open(ROOT / "bench" / "RESULTS.md", "a") as f:
        f.write(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None, help="an already running server (its pid via --pid)")
    ap.add_argument("--pid", type=int, default=None)
    ap.add_argument("--port", type=int, default=8790)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--warmup-minutes", type=float, default=3.0)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        if args.url is None:
            cmd = [sys.executable, "-m", "hearth.cli", "serve", "--embeddings", "--port", str(args.port)]
            proc = stack.enter_context(running(cmd, args.port, {**os.environ, "HF_HUB_OFFLINE": "1"}))
            url, pid = f"http://127.0.0.1:{args.port}", proc.pid
        else:
            url, pid = args.url, args.pid
        soak = Soak(url, args.minutes, args.clients, args.max_tokens)
        samples = soak.run(pid)
        result = summary(samples, args.warmup_minutes * 60)
        out = ROOT / "bench" / "out"
        out.mkdir(exist_ok=True)
        (out / f"soak-{int(time.time())}.json").write_text(json.dumps(
            {"samples": samples, "counts": soak.counts, "errors": soak.errors[:200], "summary": result}, indent=1))
        print(json.dumps({"requests": dict(soak.counts), "errors": len(soak.errors), **result}, indent=1))
        for error in soak.errors[:20]:
            print("error:", error)
        if args.record:
            print(record(args, soak, result, samples))


if __name__ == "__main__":
    main()
