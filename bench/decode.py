#!/usr/bin/env python
"""Single-stream decode speed and time to first token, side by side:
raw mlx-lm `stream_generate`, `mlx_lm.server`, and `hearth serve`, on one
~100M-parameter random float32 llama, under each BLAS named in --blas.

    .venv/bin/python bench/decode.py [--tokens 128] [--runs 3] [--blas auto,openblas,reference] [--record]

`auto` is the library `hearth` picks here (core/blas.py measures the
installed ones first, in the benchmark's own HEARTH_HOME): raw mlx-lm and
mlx_lm.server get it preloaded, and `hearth serve` starts with a plain
environment and chooses it itself. Under `reference` nothing is preloaded:
that is mlx_lm.server as the wheel ships it.
Every measurement runs in its own process (LD_PRELOAD only takes at start).
Special tokens and lone partial-UTF-8 byte tokens are suppressed with one logit_bias,
the same for every runner, so each run decodes exactly --tokens of printable text.
`--record` appends the table, the command and the commit to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
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

from core import blas as blas_lib  # noqa: E402
from core.blas import find_openblas  # noqa: E402

PROMPT = [{"role": "user", "content": "Tell me a long story about a quiet house by the river."}]


def build_model(out: Path) -> int:
    """A random llama of about 100M parameters (float32) with a small BPE."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    from serving.demo import corpus
    from serving.demo.build import _corpus_text
    from serving.demo.files import IM_END, llama_config, train_tokenizer, write_model_dir

    # No markup tokens: mlx-lm would see <think> in the vocabulary and render every
    # prompt with thinking on, so the runners would not decode the same prompt.
    tok = train_tokenizer(_corpus_text(corpus.samples(0, 2000)), 512, markup=False)
    config = llama_config(tok.get_vocab_size(), 1024, 8, 16, 2816, 4096, tok.token_to_id(IM_END))
    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    write_model_dir(out, weights, config, tok, {"eos_token_id": config["eos_token_id"]})
    return sum(v.size for v in weights.values())


def commit_label() -> str:
    """The short commit a recorded run measured."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "uncommitted"


def bench_args(doc: str, tokens: int, runs: int, port: int, extra=None) -> argparse.Namespace:
    """The flags every side-by-side benchmark takes, with its own defaults
    (`extra` adds a benchmark's own to the parser)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=tokens)
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--record", action="store_true")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def publish(args, lines: list[str], work: Path) -> None:
    """Print a benchmark's report, append it to bench/RESULTS.md with --record, and clean up."""
    print("\n".join(lines))
    if args.record:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write("\n".join(lines) + "\n")
    shutil.rmtree(work, ignore_errors=True)


def preloaded_env(work: Path) -> tuple[dict, str]:
    """The environment a server or raw run gets here: homes under `work`,
    offline, and OpenBLAS preloaded when this machine has it; and its name."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "_HEARTH_REEXEC")}
    env.update(HF_HUB_OFFLINE="1", HEARTH_HOME=str(work / "home"), HF_HOME=str(work / "hf"))
    lib = find_openblas()
    if lib:
        env.update(LD_PRELOAD=lib, _HEARTH_REEXEC="1")
    return env, "OpenBLAS" if lib else "reference"


def suppressed_ids(model: Path) -> list[int]:
    """Special tokens and lone partial UTF-8 bytes: suppressed, so each runner
    decodes plain, printable text that streams token by token (a random model
    otherwise emits byte soup that servers rightly hold back)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    special = json.loads((model / "tokenizer.json").read_text())["added_tokens"]
    ids = [t["id"] for t in special if t.get("special")]
    return ids + [i for i in range(tok.get_vocab_size()) if "\ufffd" in tok.decode([i])]


RAW = r"""
import json, sys, time
import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_logits_processors
path, tokens, runs, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
suppress = json.loads(sys.argv[5])
model, tok = load(path)
ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
ids = tok.encode(ids, add_special_tokens=False)
procs = make_logits_processors({e: -100.0 for e in suppress})  # the servers get the same bias
out = []
for run in range(runs + 1):
    start = time.perf_counter(); first = last = None; n = 0
    for r in stream_generate(model, tok, ids, max_tokens=tokens, logits_processors=procs):
        last = time.perf_counter(); first = first or last; n += 1
    if run:  # the first run warms up
        out.append({"ttft": first - start, "tps": (n - 1) / (last - first), "tokens": n})
print(json.dumps(out))
"""


def measure_raw(path: Path, env: dict, tokens: int, runs: int, suppress: list[int]) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", RAW, str(path), str(tokens), str(runs), json.dumps(PROMPT),
                           json.dumps(suppress)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def stream_once(port: int, tokens: int, eos: list[int], model: str, headers: dict | None = None) -> dict:
    # mlx_lm.server loads whatever `model` names, so name the served directory.
    body = {"model": model, "messages": PROMPT, "max_tokens": tokens, "stream": True, "temperature": 0,
            "logit_bias": {str(e): -100 for e in eos}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"content-type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    stamps = []
    while line := resp.readline():
        line = line.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        choice = (chunk.get("choices") or [{}])[0]
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content"):
            stamps.append(time.perf_counter())
    conn.close()
    return {"ttft": stamps[0] - start, "tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]), "tokens": len(stamps)}


def settle(port: int) -> None:
    """Let a fresh `hearth serve` finish its one-time machine measurement
    (memory bandwidth, in a background thread at the first start in a
    HEARTH_HOME) before anything is timed: `/fit` waits for it. Other
    servers answer 404 at once."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        conn.request("GET", "/fit")
        conn.getresponse().read()
    except OSError:
        pass


def wait_up(port: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v1/models")
            if conn.getresponse().status == 200:
                settle(port)
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("server did not come up")


def measure_server(cmd: list[str], port: int, env: dict, tokens: int, runs: int, eos: list[int],
                   model: str) -> list[dict]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        wait_up(port, proc)
        stream_once(port, tokens, eos, model)  # warm-up
        return [stream_once(port, tokens, eos, model) for _ in range(runs)]
    finally:
        proc.terminate()
        proc.wait(60)


def summarize(rows: list[dict]) -> dict:
    return {"tps": statistics.median(r["tps"] for r in rows),
            "ttft_ms": 1000 * statistics.median(r["ttft"] for r in rows)}


def _blas_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--blas", default="auto,openblas,reference",
                        help=f"comma-separated, from {', '.join(blas_lib.CHOICES)} (default: %(default)s)")


def blas_modes(names: list[str], base: dict, home: Path) -> tuple[list[tuple[str, dict, dict]], dict | None]:
    """(label, environment of raw mlx-lm and mlx_lm.server, environment of hearth)
    per BLAS, and the measurement behind `auto` (None without it)."""
    installed = {c.name: c for c in blas_lib.installed()}
    modes, seen, record = [], set(), None
    for name in names:
        if name == "auto":
            choice = blas_lib.choose("auto", "option", home / "blas.json", say=print)
            record = json.loads((home / "blas.json").read_text()) if (home / "blas.json").exists() else None
            candidate, label = choice.candidate, f"auto: {choice.candidate.name}"
            hearth_env = dict(base)  # hearth chooses for itself, from the cache just written
        elif name in installed:
            candidate, label = installed[name], name
            hearth_env = dict(blas_lib.preload_env(candidate, base), _HEARTH_REEXEC="1")
        else:
            print(f"{name}: not installed here, skipped")
            continue
        if candidate.name in seen:
            continue
        seen.add(candidate.name)
        modes.append((label, dict(blas_lib.preload_env(candidate, base), _HEARTH_REEXEC="1"), hearth_env))
    return modes, record


def main() -> int:
    args = bench_args(__doc__, tokens=128, runs=3, port=18431, extra=_blas_option)

    work = Path(tempfile.mkdtemp(prefix="hearth-bench-"))
    model = work / "bench-llama-100m"
    params = build_model(model)
    eos = suppressed_ids(model)
    print(f"model: {params / 1e6:.0f}M parameters, float32, at {model}", flush=True)

    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "_HEARTH_REEXEC", "HEARTH_BLAS")}
    base.update(HF_HUB_OFFLINE="1", HEARTH_HOME=str(work / "home"), HF_HOME=str(work / "hf"))
    modes, record = blas_modes([n.strip() for n in args.blas.split(",") if n.strip()], base, work / "home")

    results = []
    for blas, env, hearth_env in modes:
        raw = summarize(measure_raw(model, env, args.tokens, args.runs, eos))
        mlx_server = summarize(measure_server(
            [sys.executable, "-m", "mlx_lm.server", "--model", str(model), "--port", str(args.port)],
            args.port, env, args.tokens, args.runs, eos, str(model)))
        hearth = summarize(measure_server(
            [sys.executable, "-m", "hearth.cli", "serve", str(model), "--port", str(args.port + 1)],
            args.port + 1, hearth_env, args.tokens, args.runs, eos, str(model)))
        for name, r in (("raw mlx-lm stream_generate", raw), ("mlx_lm.server", mlx_server), ("hearth serve", hearth)):
            results.append((blas, name, r, r["tps"] / raw["tps"]))
            print(f"{blas:14} {name:28} {r['tps']:7.1f} tok/s  TTFT {r['ttft_ms']:7.1f} ms  "
                  f"{r['tps'] / raw['tps']:.2f}x raw", flush=True)

    if args.record:
        record_results(args, params, results, record)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def record_results(args, params: int, results: list, measurement: dict | None) -> None:
    commit = commit_label()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "inference", "config", "core"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    lines = [
        f"\n## {time.strftime('%Y-%m-%d')} · commit {commit}{' (+ local changes)' if dirty else ''}\n",
        f"`python bench/decode.py --tokens {args.tokens} --runs {args.runs} --blas {args.blas} --record` on "
        f"{platform.machine()}, {os.cpu_count()} cores ({blas_lib.cpu_model()}), {platform.python_version()}; "
        f"random llama {params / 1e6:.0f}M params float32, {args.tokens} tokens, median of {args.runs}.\n",
    ]
    if measurement:
        lines += [f"hearth's BLAS measurement (MLX float32 GFLOP/s against 2048 x 2048, the best call of "
                  f"{blas_lib.ROUNDS} rounds of {blas_lib.BUDGET_S} s per size; score = geometric mean; other "
                  f"processes took {measurement.get('others_cpu', 0):.0%} of the CPU meanwhile):\n",
                  "| library | M=1 | M=8 | M=32 | score |", "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['name']}{' (picked)' if r['name'] == measurement['best'] else ''} | "
                  + " | ".join(str(r["gflops"].get(m, "-")) for m in ("1", "8", "32")) + f" | {r['score']} |"
                  if r["ok"] else f"| {r['name']} | rejected: {r['error']} | | | |" for r in measurement["results"]]
        lines.append("")
    lines += ["| BLAS | runner | decode tok/s | TTFT ms | vs raw |", "| --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {b} | {n} | {r['tps']:.1f} | {r['ttft_ms']:.0f} | {x:.2f}x |" for b, n, r, x in results]
    with open(ROOT / "bench" / "RESULTS.md", "a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
