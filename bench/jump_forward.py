#!/usr/bin/env python
"""Jump-forward decoding under a grammar, measured side by side on bench/decode.py's
~100M random llama: `hearth serve` (jump-forward on, the default) and
`hearth serve --no-jump-forward`, one request at a time, each asked for
objects of a schema-heavy `response_format` (many keys, enums, booleans,
bounded integers and short strings: the structure the grammar decides
alone), at temperature 0; plus `mlx_lm.server` decoding the same number of
tokens free (it has no grammar), as the plain decode rate of this machine.

    .venv/bin/python bench/jump_forward.py [--runs 3] [--record]

Reported per runner: wall time per object (median), completion tokens,
the forwards the model ran (`usage.fill.decodeSteps` + 1 with jump-forward, one
per token without), and tokens per second of wall time. Both Hearth runs
must produce objects the schema accepts.
"""
from __future__ import annotations

import http.client
import json
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

from decode import bench_args, build_model, commit_label, preloaded_env, publish, suppressed_ids, wait_up  # noqa: E402

SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["order_id", "status", "priority", "express", "gift_wrap", "quantity", "warehouse", "carrier",
                 "customer", "items"],
    "properties": {
        "order_id": {"type": "integer", "minimum": 0, "maximum": 99999},
        "status": {"enum": ["pending_payment", "processing", "shipped", "delivered", "cancelled"]},
        "priority": {"enum": ["standard", "expedited", "overnight"]},
        "express": {"type": "boolean"},
        "gift_wrap": {"type": "boolean"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
        "warehouse": {"enum": ["north_distribution_center", "south_distribution_center"]},
        "carrier": {"enum": ["united_parcel_service", "federal_express", "national_postal_service"]},
        "customer": {"type": "object", "additionalProperties": False, "required": ["tier", "newsletter", "region"],
                     "properties": {"tier": {"enum": ["bronze_member", "silver_member", "gold_member"]},
                                    "newsletter": {"type": "boolean"},
                                    "region": {"enum": ["europe_middle_east_africa", "asia_pacific",
                                                        "north_and_south_america"]}}},
        "items": {"type": "array", "minItems": 2, "maxItems": 2,
                  "items": {"type": "object", "additionalProperties": False,
                            "required": ["sku", "category", "fragile"],
                            "properties": {"sku": {"type": "string", "maxLength": 4},
                                           "category": {"enum": ["electronics_and_gadgets", "home_and_kitchen",
                                                                 "books_and_stationery"]},
                                           "fragile": {"type": "boolean"}}}},
    },
}


def ask(port: int, model: str, suppress: list[int]) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "An order, as JSON."}], "temperature": 0,
            "max_tokens": 600, "logit_bias": {str(t): -100 for t in suppress},
            "response_format": {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA,
                                                                       "strict": True}}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    wall = time.perf_counter() - start
    text = reply["choices"][0]["message"]["content"]
    value = json.loads(text, strict=False)  # a random model's strings may hold control characters
    assert set(value) == set(SCHEMA["required"]), text
    usage = reply["usage"]
    fill = usage.get("fill")
    return {"wall": wall, "tokens": usage["completion_tokens"],
            # With jump-forward, a forward per sampled token and the last one, after which the finished grammar
            # leaves only a stop token (not sampled).
            "forwards": fill["decodeSteps"] + 1 if fill else usage["completion_tokens"],
            "injected": fill["injected"] if fill else 0}


def free(port: int, model: str, tokens: int, suppress: list[int]) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "An order, as JSON."}], "temperature": 0,
            "max_tokens": tokens, "logit_bias": {str(t): -100 for t in suppress}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    return {"wall": time.perf_counter() - start, "tokens": reply["usage"]["completion_tokens"],
            "forwards": reply["usage"]["completion_tokens"], "injected": 0}


def serve(cmd: list[str], port: int, env: dict, measure) -> list[dict]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        wait_up(port, proc)
        measure()  # warm-up: the grammar compiles, the prompt cache fills
        return [measure() for _ in range(RUNS)]
    finally:
        proc.terminate()
        proc.wait(60)


RUNS = 3


def main() -> int:
    global RUNS
    args = bench_args(__doc__, tokens=0, runs=3, port=18461)
    RUNS = args.runs
    work = Path(tempfile.mkdtemp(prefix="hearth-bench-"))
    model = work / "bench-llama-100m"
    params = build_model(model)
    suppress = suppressed_ids(model)
    env, blas = preloaded_env(work)
    hearth = [sys.executable, "-m", "hearth.cli", "serve", str(model), "--no-worker"]
    on = serve([*hearth, "--port", str(args.port)], args.port, env, lambda: ask(args.port, str(model), suppress))
    off = serve([*hearth, "--no-jump-forward", "--port", str(args.port + 1)], args.port + 1, env,
                lambda: ask(args.port + 1, str(model), suppress))
    tokens = round(statistics.median(r["tokens"] for r in off))
    mlx = serve([sys.executable, "-m", "mlx_lm.server", "--model", str(model), "--port", str(args.port + 2)],
                args.port + 2, env, lambda: free(args.port + 2, str(model), tokens, suppress))
    rows = []
    for name, runs in (("hearth serve (jump-forward)", on), ("hearth serve --no-jump-forward", off),
                       ("mlx_lm.server, no grammar (free text)", mlx)):
        wall = statistics.median(r["wall"] for r in runs)
        n = statistics.median(r["tokens"] for r in runs)
        rows.append((name, wall, n, statistics.median(r["forwards"] for r in runs),
                     statistics.median(r["injected"] for r in runs), n / wall))
    base = rows[1][1]
    lines = [f"\n## {time.strftime('%Y-%m-%d')} · jump-forward under a grammar · commit {commit_label()}\n",
             f"`python bench/jump_forward.py --runs {args.runs}{' --record' if args.record else ''}` on "
             f"{platform.machine()}, {blas}; random llama {params / 1e6:.0f}M params float32, one request at a "
             f"time, temperature 0, a 10-key order schema (enums, booleans, integers, a nested object, two "
             f"items), median of {args.runs}.\n",
             "| runner | wall s per object | completion tokens | model forwards | appended unsampled | "
             "tokens/s of wall | vs --no-jump-forward |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {name} | {wall:.2f} | {n:.0f} | {fw:.0f} | {inj:.0f} | {tps:.1f} | {base / wall:.2f}x |"
              for name, wall, n, fw, inj, tps in rows]
    publish(args, lines, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
