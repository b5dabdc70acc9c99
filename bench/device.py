#!/usr/bin/env python
"""Serving overhead where compute is fast: Hearth, `mlx_lm.server` and raw
mlx-lm side by side on the same models in one run, on whatever device MLX
runs on here (MLX's CUDA build on an NVIDIA card, Metal on Apple silicon, or
this CPU with the BLAS `hearth` picks).

    .venv/bin/python bench/device.py [--models large,medium,large-q4,large-vocab]
        [--concurrency 1,8,32,64] [--tokens 128] [--quick] [--threads N] [--record]

Models, random llamas built here (nothing is downloaded):
  large        16 layers x 2048 wide, bfloat16 (~0.8B parameters), a 512-token BPE
  medium       12 x 1024, float32
  large-q4     `large` quantized to 4 bits by mlx-lm (`mlx_lm.convert -q`)
  large-vocab  `large` with a vocabulary of 151,936 (Qwen's size); only the
               BPE's 512 ids are ever sampled (the other rows of the head are
               zero), so the work over the whole vocabulary each step is what
               this row adds
`--quick` builds the same four at 2 layers x 256 (a smoke run for a CPU).

For each model and concurrency C:
  raw          C = 1: `stream_generate`, decode tokens/s after the first
               token and the prefill time; C > 1: `BatchGenerator` with C rows
               (the same prompts), aggregate decode tokens/s, and the prefill
               time of all C prompts (`stats.prompt_time`)
  engine       Hearth's engine in one process, without HTTP, under the
               servers' load below (`Engine.submit`): aggregate tokens/s,
               the median stream's decode tokens/s and TTFT; between raw
               and `hearth serve` it tells the engine's cost from the
               serving path's
  servers      C streaming clients, 2C requests (at least 4), each exactly
               --tokens tokens: aggregate tokens/s, the median stream's decode
               tokens/s after its first token, median TTFT, errors, and the
               serving process's CPU time per 1,000 tokens (all its threads;
               for Hearth also its event loop's thread alone): on a fast
               device, what serving costs beside the model; and the
               clients' own (this process's) CPU per 1,000 tokens, which on
               a machine of few cores competes with the server's
Every runner bans the same ids (special tokens, lone partial-UTF-8 bytes) with
a logit bias, so each request decodes exactly --tokens tokens of plain text.
`hearth serve` runs with `--no-worker`. Each server is its
own process, and so are the raw and engine runs. `--record` appends the tables, the command, the commit, the
device and the date to bench/RESULTS.md (or `--results FILE`).

On the GPU machine (no .venv there: `hearth` runs as `python -m hearth.cli`
from this checkout), after `../shared/device/pack-mlx-cuda.sh` here and the
folders it makes copied over in order:

    eval "$(bash .gpuN/install.sh)" && python3 bench/device.py --record --results "$OUT/RESULTS-gpu.md"

then append $OUT/RESULTS-gpu.md to bench/RESULTS.md here.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode import commit_label, suppressed_ids, wait_up  # noqa: E402

SHAPES = {  # name: (layers, hidden, heads, intermediate, dtype, vocab or None for the BPE's own)
    "large": (16, 2048, 16, 5504, "bfloat16", None),
    "medium": (12, 1024, 16, 2816, "float32", None),
    "large-vocab": (16, 2048, 16, 5504, "bfloat16", 151936),
}
QUICK = {"large": (2, 256, 4, 704, "bfloat16", None), "medium": (2, 256, 4, 704, "float32", None),
         "large-vocab": (2, 256, 4, 704, "bfloat16", 151936)}
WORDS = "river house quiet keeper light tower stone window garden morning evening bread tea letter".split()


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Story {i}: tell me a long tale about the {WORDS[i % len(WORDS)]} "
                                        f"by the river, and the {WORDS[(i * 7) % len(WORDS)]} too."}]


def build(name: str, work: Path, quick: bool) -> Path:
    """The model `name` in `work/name` (large-q4 converts large, built first)."""
    out = work / name
    if out.exists():
        return out
    if name == "large-q4":
        from mlx_lm import convert

        convert(str(build("large", work, quick)), mlx_path=str(out), quantize=True, q_bits=4, q_group_size=64)
        return out
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    from serving.demo import corpus
    from serving.demo.build import _corpus_text
    from serving.demo.files import IM_END, llama_config, train_tokenizer, write_model_dir

    layers, hidden, heads, inter, dtype, vocab = (QUICK if quick else SHAPES)[name]
    tok = train_tokenizer(_corpus_text(corpus.samples(0, 2000)), 512, markup=False)
    config = llama_config(vocab or tok.get_vocab_size(), hidden, layers, heads, inter, 4096,
                          tok.token_to_id(IM_END))
    config["tie_word_embeddings"] = False
    config["torch_dtype"] = dtype
    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(config))
    weights = {k: v.astype(getattr(mx, dtype)) for k, v in tree_flatten(model.parameters())}
    if vocab:  # rows past the BPE's ids: zero, so they never win and never reach a detokenizer
        used = tok.get_vocab_size()
        for key in ("model.embed_tokens.weight", "lm_head.weight"):
            w = np.array(weights[key].astype(mx.float32))
            w[used:] = 0
            weights[key] = mx.array(w).astype(getattr(mx, dtype))
    write_model_dir(out, weights, config, tok, {"eos_token_id": config["eos_token_id"]})
    return out


RAW = r"""
import json, sys, time
import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_logits_processors
path, tokens = sys.argv[1], int(sys.argv[2])
rows, prompts, suppress = (json.loads(a) for a in sys.argv[3:6])
model, tok = load(path)
ids = [tok.encode(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
       for p in prompts]
bias = {e: -100.0 for e in suppress}
out = {}
for run in range(2):  # the first warms up
    start = time.perf_counter(); first = last = None; n = 0
    for r in stream_generate(model, tok, ids[0], max_tokens=tokens, logits_processors=make_logits_processors(bias)):
        last = time.perf_counter(); first = first or last; n += 1
    out["1"] = {"decode_tps": (n - 1) / (last - first), "prefill_ms": 1000 * (first - start), "tokens": n}
for c in rows:
    if c == 1:
        continue
    for run in range(2):
        gen = BatchGenerator(model, stop_tokens=[], completion_batch_size=c, prefill_batch_size=c)
        gen.insert(ids[:c], [tokens] * c, logits_processors=[make_logits_processors(bias) for _ in range(c)])
        n = 0
        with gen.stats() as stats:
            while responses := gen.next_generated():
                n += len(responses)
        gen.close()
    out[str(c)] = {"decode_tps": stats.generation_tps, "prefill_ms": 1000 * stats.prompt_time, "tokens": n}
print(json.dumps(out), flush=True)
mx.clear_streams()  # MLX's advice before a process that used its streams ends
"""


# Hearth's engine in one process, no HTTP: the load the servers get (2C requests, C at a time, the same
# prompts and bias), through `Engine.submit`. Between raw mlx-lm and `hearth serve` it tells the engine's
# cost from the serving path's.
ENGINE = r"""
import asyncio, json, statistics, sys, time
from inference.engine.engine import Engine
from inference.engine.types import GenerationRequest, LogitsParams
path, tokens = sys.argv[1], int(sys.argv[2])
rows, prompts, suppress = (json.loads(a) for a in sys.argv[3:6])
engine = Engine(path)
engine.start()
tok = engine.loaded.tokenizer
ids = [tok.encode(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
       for p in prompts]
bias = {e: -100.0 for e in suppress}

async def one(i, n, gate, out):
    async with gate:
        start = time.perf_counter(); first = last = None; count = 0
        sub = engine.submit(GenerationRequest(prompt_tokens=ids[i % len(ids)], max_tokens=n,
                                              logits=LogitsParams(logit_bias=bias)))
        async for event in sub.events():
            if event.error:
                raise RuntimeError(event.error)
            if event.token_ids:
                last = time.perf_counter(); first = first or last; count += len(event.token_ids)
        out.append((first - start, count, (count - 1) / (last - first) if last > first else None))

async def load(c, n):
    gate, out = asyncio.Semaphore(c), []
    start = time.perf_counter()
    await asyncio.gather(*[one(i, n, gate, out) for i in range(max(4, 2 * c))])
    wall = time.perf_counter() - start
    rates = [r for _, _, r in out if r]
    return {"agg_tps": sum(k for _, k, _ in out) / wall, "decode_tps": statistics.median(rates) if rates else 0.0,
            "ttft_ms": 1000 * statistics.median(t for t, _, _ in out)}

asyncio.run(load(2, 8))  # warm-up, as each server gets
result = {str(c): asyncio.run(load(c, tokens)) for c in rows}
engine.close()
print(json.dumps(result))
"""


def in_process(script: str, what: str, path: Path, env: dict, tokens: int, rows: list[int],
               suppress: list[int]) -> dict:
    """Run RAW or ENGINE in a process of its own; its last line of output is the result."""
    prompts = [prompt(i) for i in range(max(rows))]
    done = subprocess.run([sys.executable, "-c", script, str(path), str(tokens), json.dumps(rows), json.dumps(prompts),
                           json.dumps(suppress)], env=env, capture_output=True, text=True, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr[-2000:]}") from None
    if done.returncode:  # measured, then it failed on the way out: the numbers stand, the exit is reported
        print(f"warning: {what} exited {done.returncode} after its result: {done.stderr[-500:]}", file=sys.stderr)
    return result


def one_stream(port: int, model: str, i: int, tokens: int, bias: dict, out: list) -> None:
    """One streaming request: TTFT, its decode rate after the first content chunk (None when all its text
    came in one chunk: a parser may hold back text that could open markup), and the tokens the usage counts."""
    body = {"model": model, "messages": prompt(i), "max_tokens": tokens, "stream": True, "temperature": 0,
            "logit_bias": bias, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            out.append({"error": resp.status})
            return
        stamps, used = [], None
        while line := resp.readline():
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            used = chunk.get("usage") or used
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    stamps.append(time.perf_counter())
        conn.close()
    except OSError as exc:  # a reset connection is an error of the run, not of the benchmark
        out.append({"error": type(exc).__name__})
        return
    if not stamps:
        out.append({"error": "no text"})
        return
    n = (used or {}).get("completion_tokens") or len(stamps)
    out.append({"ttft": stamps[0] - start, "tokens": n,
                "decode_tps": (n - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None})


def timed(threads: list[threading.Thread]) -> float:
    """Start `threads`, wait for them all, and return the seconds that took."""
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def load(port: int, model: str, c: int, tokens: int, bias: dict) -> dict:
    n = max(4, 2 * c)
    out: list[dict] = []
    lock = threading.Semaphore(c)

    def worker(i: int) -> None:
        with lock:
            one_stream(port, model, i, tokens, bias, out)

    wall = timed([threading.Thread(target=worker, args=(i,)) for i in range(n)])
    ok = [r for r in out if "error" not in r]
    failed = sorted({str(r["error"]) for r in out if "error" in r})
    if failed:
        print(f"  c={c}: {n - len(ok)} errors: {', '.join(failed)}", flush=True)
    return {"agg_tps": sum(r["tokens"] for r in ok) / wall, "errors": n - len(ok), "wall": wall,
            "decode_tps": statistics.median(rates) if (rates := [r["decode_tps"] for r in ok if r["decode_tps"]])
            else float("nan"),
            "ttft_ms": 1000 * statistics.median(r["ttft"] for r in ok) if ok else float("nan")}


def listener(proc: subprocess.Popen, port: int):
    """The process (the one started or one of its children) that listens on `port`: `hearth` may re-execute
    itself with a BLAS preloaded, and the serving process is then its child."""
    import psutil

    root = psutil.Process(proc.pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            if any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in p.net_connections()):
                return p
        except psutil.Error:
            continue
    return root


def cpu_seconds(p) -> tuple[float, float]:
    """The serving process's CPU seconds (user + system): all its threads, and its main thread alone (Hearth's
    event loop: daphne, Django, the streams; `mlx_lm.server`'s accepting thread)."""
    total = p.cpu_times()
    main = next((t for t in p.threads() if t.id == p.pid), None)
    return total.user + total.system, (main.user_time + main.system_time) if main else float("nan")


def measured_load(server, port: int, model: str, c: int, tokens: int, bias: dict) -> dict:
    """`load`, with the server's CPU time per token it served: ms per 1,000 tokens, the whole process and its
    main thread (on a fast device, what serving costs beside the model); and the clients' (this process's)."""
    before, client = cpu_seconds(server), time.process_time()
    result = load(port, model, c, tokens, bias)
    after, client = cpu_seconds(server), time.process_time() - client
    served = result["agg_tps"] * result.pop("wall")  # tokens
    per_k = 1e6 / served if served else float("nan")
    result.update(cpu_ms_per_k=(after[0] - before[0]) * per_k, loop_ms_per_k=(after[1] - before[1]) * per_k,
                  client_ms_per_k=client * per_k)
    return result


@contextlib.contextmanager
def running(cmd: list[str], port: int, env: dict, cwd: Path = ROOT, log: Path | None = None):
    """The server `cmd` started, once it answers on `port`; stopped when the block ends. Its output goes to
    `log` where one is named. Every bench script starts its servers here."""
    out = open(log, "wb") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    finally:
        if log is not None:
            out.close()  # the child holds its own copy
    try:
        wait_up(port, proc, timeout=600)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(cmd: list[str], port: int, env: dict, model: str, rows: list[int], tokens: int, bias: dict) -> dict:
    with running(cmd, port, env) as proc:
        load(port, model, 2, 8, bias)  # warm-up
        server = listener(proc, port)
        return {str(c): measured_load(server, port, model, c, tokens, bias) for c in rows}


def device() -> tuple[str, bool]:
    """MLX's default device here, named, and whether it is a GPU (asked in a child: no MLX in this process)."""
    done = subprocess.run([sys.executable, "-c", "import mlx.core as mx, json; d = mx.default_device(); "
                           "print(json.dumps([str(d), mx.device_info().get('device_name', ''), d == mx.gpu]))"],
                          capture_output=True, text=True, check=True)
    kind, name, gpu = json.loads(done.stdout)
    return f"{name} ({kind})", gpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="large,medium,large-q4,large-vocab")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--port", type=int, default=18561)
    parser.add_argument("--quick", action="store_true", help="2-layer, 256-wide models: a smoke run on a CPU")
    parser.add_argument("--threads", type=int, default=0,
                        help="on a CPU: BLAS threads of every runner (0: the BLAS's own choice). With 1 on a "
                             "machine of few cores the model's compute leaves the other cores to the serving "
                             "path, as a GPU host does: what is left between Hearth and raw is the interpreter's")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"),
                        help="the file --record appends to (on the GPU machine: one under $OUT, so it comes back)")
    args = parser.parse_args()
    rows = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="hearth-bench-device-"))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "_HEARTH_REEXEC")}
    env.update(HF_HUB_OFFLINE="1", HEARTH_HOME=str(work / "home"), HF_HOME=str(work / "hf"))
    if args.threads:
        env.update({name: str(args.threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                           "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS")})
    hearth = [sys.executable, "-m", "hearth.cli"] if not (ROOT / ".venv/bin/hearth").exists() else \
        [str(ROOT / ".venv/bin/hearth")]
    where, on_gpu = device()
    # This machine's bandwidths (`/fit`) measured now, with nothing else running: a server start measures them
    # in the background otherwise, a child taking CPU while the first rows are timed.
    measured = subprocess.run([*hearth, "ls"], env=env, cwd=ROOT, capture_output=True, text=True)
    if measured.returncode:  # a warm-up: the run goes on, and the first server start measures instead
        print(f"warning: `hearth ls` exited {measured.returncode}: {measured.stderr[-500:]}", file=sys.stderr)
    raw_env, blas_name = dict(env), "none (GPU)"
    if not on_gpu and sys.platform == "linux":  # raw mlx-lm and mlx_lm.server get the BLAS hearth picks
        from core import blas

        choice = blas.choose("auto", "env", work / "home" / "blas.json")
        raw_env = blas.launch_env(choice, raw_env)
        blas_name = choice.candidate.label
    lines = [f"\n## bench/device.py: {time.strftime('%Y-%m-%d')}, commit {commit_label()}, {where}, "
             f"{platform.machine()}, BLAS: {blas_name}",
             f"`{' '.join(['bench/device.py', *sys.argv[1:]])}`; {args.tokens} tokens a request, EOS banned"
             + (f"; {args.threads} BLAS thread(s) a runner" if args.threads else ""),
             ""]
    print("\n".join(lines), flush=True)
    for name in args.models.split(","):
        path = build(name, work, args.quick)
        bias = {str(i): -100 for i in suppressed_ids(path)}
        model_id = str(path)
        base = in_process(RAW, "raw mlx-lm", path, raw_env, args.tokens, rows, [int(i) for i in bias])
        engine = in_process(ENGINE, "Hearth's engine", path, raw_env, args.tokens, rows, [int(i) for i in bias])
        mlx = serve([sys.executable, "-m", "mlx_lm.server", "--model", str(path), "--port", str(args.port)],
                    args.port, raw_env, model_id, rows, args.tokens, bias)
        ours = serve([*hearth, "serve", str(path), "--port", str(args.port), "--no-worker"], args.port, env,
                     model_id, rows, args.tokens, bias)
        table = [f"**{name}**", "",
                 "| c | raw decode tok/s | raw prefill ms | mlx_lm.server tok/s (errors) | Hearth tok/s (errors) | "
                 "Hearth decode tok/s | Hearth TTFT med ms | Hearth / raw | Hearth / mlx_lm.server | "
                 "TTFT / raw prefill | engine alone: tok/s, decode, TTFT ms | CPU ms / 1k tok: mlx_lm.server | "
                 "Hearth (its event loop) | the clients, Hearth's run |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in rows:
            r, m, h, e = base[str(c)], mlx[str(c)], ours[str(c)], engine[str(c)]
            vs_raw = (h["decode_tps"] if c == 1 else h["agg_tps"]) / r["decode_tps"]
            table.append(f"| {c} | {r['decode_tps']:.0f} | {r['prefill_ms']:.0f} | {m['agg_tps']:.0f} "
                         f"({m['errors']}) | {h['agg_tps']:.0f} ({h['errors']}) | {h['decode_tps']:.0f} | "
                         f"{h['ttft_ms']:.0f} | {vs_raw:.2f}x | {h['agg_tps'] / m['agg_tps']:.2f}x | "
                         f"{h['ttft_ms'] / r['prefill_ms']:.2f}x | {e['agg_tps']:.0f}, {e['decode_tps']:.0f}, "
                         f"{e['ttft_ms']:.0f} | {m['cpu_ms_per_k']:.0f} | "
                         f"{h['cpu_ms_per_k']:.0f} ({h['loop_ms_per_k']:.0f}) | {h['client_ms_per_k']:.0f} |")
        print("\n".join(table) + "\n", flush=True)
        lines += table + [""]
    lines.append("c = 1 compares Hearth's decode rate with one raw stream's; c > 1 Hearth's aggregate with the raw "
                 "batch's decode rate (no prefill in it), so it is the stricter of the two. \"Engine alone\" is "
                 "Hearth's engine in one process under the servers' load, without HTTP: the gap from it to Hearth "
                 "is the serving path's, the gap from raw to it the engine's.")
    if args.record:
        with open(args.results, "a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
