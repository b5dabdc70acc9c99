#!/usr/bin/env python
"""Speculative decoding by prompt lookup, measured side by side: raw mlx-lm,
`mlx_lm.server`, `hearth serve` and `hearth serve --draft-kind ngram`, one
stream at a time, at temperature 0, on

  copy     bench/copy_model.py's small llama trained to continue lines it has
           seen, asked to say a list of lines again (the continuation copies
           the prompt: what prompt lookup is for);
  random   bench/decode.py's ~100M random llama. Greedy, it falls into a
           loop of one word, which prompt lookup guesses too; sampled at
           temperature 1 (seeded: the same tokens with and without drafts)
           its output is noise, so most guesses are wrong (what they cost).

    .venv/bin/python bench/speculation.py [--tokens 96] [--runs 3] [--record]

Every runner decodes the same prompt with the same suppressed tokens, and
Hearth's outputs with and without speculation are compared token for token.
`--record` appends the table, the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from copy_model import build_copy_model, copy_prompt  # noqa: E402
from decode import (  # noqa: E402
    bench_args,
    build_model,
    commit_label,
    preloaded_env,
    publish,
    suppressed_ids,
    wait_up,
)

RAW = r"""
import json, sys, time
from mlx_lm import load, stream_generate
import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors, make_sampler
path, tokens, runs, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
suppress, temperature = json.loads(sys.argv[5]), float(sys.argv[6])
model, tok = load(path)
ids = tok.encode(prompt, add_special_tokens=False)
procs = make_logits_processors({e: -100.0 for e in suppress})
out = []
for run in range(runs + 1):
    start = time.perf_counter(); first = last = None; n = 0; text = ""
    mx.random.seed(3)
    for r in stream_generate(model, tok, ids, max_tokens=tokens, logits_processors=procs,
                             sampler=make_sampler(temperature)):
        last = time.perf_counter(); first = first or last; n += 1; text += r.text
    if run:
        out.append({"ttft": first - start, "tps": (n - 1) / (last - first), "tokens": n, "text": text})
print(json.dumps(out))
"""


def raw(model: Path, env: dict, prompt: str, tokens: int, runs: int, suppress: list[int],
        temperature: float) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", RAW, str(model), str(tokens), str(runs), prompt, json.dumps(suppress),
                           str(temperature)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def complete(port: int, model: str, prompt: str, tokens: int, suppress: list[int], temperature: float) -> dict:
    """One streamed /v1/completions: decode rate over the tokens after the first, usage, text."""
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": temperature, "seed": 3,
            "stream": True,
            "logit_bias": {str(t): -100 for t in suppress}, "stream_options": {"include_usage": True}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    first = last = None
    text, usage = "", {}
    while line := resp.readline():
        line = line.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        usage = chunk.get("usage") or usage
        piece = (chunk.get("choices") or [{}])[0].get("text") or ""
        if piece:
            last = time.perf_counter()
            first = first or last
            text += piece
    conn.close()
    n = usage.get("completion_tokens", 0)
    return {"ttft": first - start, "tps": (n - 1) / (last - first) if last and last > first else 0.0, "tokens": n,
            "text": text, "speculation": usage.get("speculation")}


def serve(cmd: list[str], port: int, env: dict, model: str, prompt: str, tokens: int, runs: int,
          suppress: list[int], temperature: float, log: Path) -> list[dict]:
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_up(port, proc)
        complete(port, model, prompt, tokens, suppress, temperature)  # warm-up
        return [complete(port, model, prompt, tokens, suppress, temperature) for _ in range(runs)]
    finally:
        proc.terminate()
        proc.wait(120)


def main() -> int:
    args = bench_args(__doc__, tokens=96, runs=3, port=18731)
    work = Path(tempfile.mkdtemp(prefix="hearth-bench-spec-"))
    env, blas = preloaded_env(work)
    models = {"copy": build_copy_model(work / "copy-llama", progress=lambda m: print(m, flush=True)),
              "random": work / "bench-llama-100m"}  # copy: a repeated line; random: that prompt too
    build_model(models["random"])
    table, notes = [], []
    legs = [("copy", models["copy"], 0.0), ("random", models["random"], 0.0), ("random", models["random"], 1.0)]
    for task, model, temperature in legs:
        prompt = copy_prompt(1)
        suppress = suppressed_ids(model)
        hearth = [sys.executable, "-m", "hearth.cli", "serve", str(model), "--no-worker", "--port", str(args.port)]
        t = (temperature, f"{task}-{temperature}")
        rows = {
            "raw mlx-lm stream_generate": raw(model, env, prompt, args.tokens, args.runs, suppress, temperature),
            "mlx_lm.server": serve([sys.executable, "-m", "mlx_lm.server", "--model", str(model), "--port",
                                    str(args.port + 1)], args.port + 1, env, str(model), prompt, args.tokens,
                                   args.runs, suppress, t[0], work / f"mlx-{t[1]}.log"),
            "hearth serve": serve(hearth, args.port, env, str(model), prompt, args.tokens, args.runs, suppress, t[0],
                                  work / f"hearth-{t[1]}.log"),
            "hearth serve --draft-kind ngram": serve(hearth + ["--draft-kind", "ngram"], args.port, env, str(model),
                                                     prompt, args.tokens, args.runs, suppress, t[0],
                                                     work / f"spec-{t[1]}.log"),
        }
        plain = statistics.median(r["tps"] for r in rows["hearth serve"])
        for name, runs in rows.items():
            tps = statistics.median(r["tps"] for r in runs)
            spec = runs[-1].get("speculation")
            acc = f"{spec['accepted']}/{spec['drafted']} ({spec['targetCalls']} forwards)" if spec else ""
            table.append(f"| {task}, T={temperature:g} | {name} | {tps:.1f} | {tps / plain:.2f}x | "
                         f"{1000 * statistics.median(r['ttft'] for r in runs):.0f} | {acc} |")
        same = rows["hearth serve"][-1]["text"] == rows["hearth serve --draft-kind ngram"][-1]["text"]
        notes.append(f"{task}, T={temperature:g}: Hearth's text with and without prompt lookup "
                     f"{'identical' if same else 'DIFFERS'}; it begins "
                     f"{rows['hearth serve --draft-kind ngram'][-1]['text'][:60]!r}")
    commit = commit_label()
    lines = [
        f"\n## {time.strftime('%Y-%m-%d')} · speculative decoding (prompt lookup) · commit {commit}\n",
        f"`python bench/speculation.py --tokens {args.tokens} --runs {args.runs}` on {platform.machine()}, "
        f"{os.cpu_count()} cores, {blas}; median of {args.runs} single streams (T: temperature, seed 3). copy: "
        "bench/copy_model.py (13M, trained to continue a repeated line of twelve words) given such a line twice; "
        "random: bench/decode.py's 100M random llama, whose greedy output loops on one word and whose sampled "
        "output is noise.\n",
        "| task | runner | decode tok/s | vs hearth plain | TTFT ms | drafts accepted |",
        "| --- | --- | ---: | ---: | ---: | --- |", *table, "", *[f"- {n}" for n in notes], "",
    ]
    publish(args, lines, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
