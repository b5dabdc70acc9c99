"""Which BLAS MLX runs on, on a Linux CPU.

MLX's Linux CPU wheel links the reference BLAS, which runs float32 matmuls
at a few GFLOP/s. `hearth` re-executes itself once with a faster library
in LD_PRELOAD (hearth/cli.py), chosen here among the ones installed:

- `openblas`: Debian's libopenblas0-pthread (`make` installs it);
- `mkl`: Intel's libmkl_rt from the `mkl` wheel (the `mkl` extra, x86-64
  Linux), or Debian's intel-mkl;
- `blis`: Debian's libblis4-pthread (`make` installs it);
- `reference`: the wheel's own BLAS, no preload.

`auto` (the default) measures every installed candidate at the first start
on a machine: a child process per library, with it preloaded, times MLX
float32 matmuls at the row counts decoding uses (M = 1, 8 and 32 rows
against a 2048 x 2048 weight), after checking the product against numpy.
The score is the geometric mean of the three GFLOP/s rates, so each size
counts alike; the highest score wins. A library that fails the check, or
is not what answers `cblas_sgemm` once preloaded, is rejected. The result
is cached in HEARTH_HOME/blas.json, keyed by the CPU model, the core count,
MLX's version and each library's path, size and modification time (and the
BLAS settings in the environment), so any change there measures again.
OpenBLAS is the fallback when nothing could be measured.

`--blas NAME` or HEARTH_BLAS=NAME picks a library without measuring.
Settings a library reads for itself (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE,
MKL_*, BLIS_*) pass through unchanged; BLIS alone runs one thread unless
told otherwise, so it is given BLIS_NUM_THREADS = the core count when that
is unset.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import glob
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from core import procs
from core.fs import write_atomically

NAMES = ("openblas", "mkl", "blis", "reference")
CHOICES = ("auto", *NAMES)
LABELS = {"openblas": "OpenBLAS", "mkl": "Intel MKL", "blis": "BLIS", "reference": "reference BLAS",
          "accelerate": "Accelerate"}
OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
)
BLIS_CANDIDATES = tuple(f"/usr/lib/{arch}-linux-gnu/blis-{threads}/libblas.so.3"
                        for arch in ("x86_64", "aarch64") for threads in ("pthread", "openmp"))
MKL_SYSTEM = ("/usr/lib/x86_64-linux-gnu/libmkl_rt.so",)
SHAPES = ((1, 2048, 2048), (8, 2048, 2048), (32, 2048, 2048))  # (M, K, N): decode-sized products
BUDGET_S = 0.15  # timing per shape, library and round; _HEARTH_BLAS_PROBE_S shortens it (the tests do)
ROUNDS = 2
BUSY = 0.25  # other processes' share of the CPU above which a measurement is flagged as disturbed
PROBE_TIMEOUT_S = 60
PROBE_VERSION = 1  # part of the cache key: a different probe measures again
PASSED_ON = ("OPENBLAS_", "MKL_", "BLIS_", "GOTO_", "OMP_NUM_THREADS", "KMP_")  # part of the cache key too
INFO_ENV = "_HEARTH_BLAS"  # what the re-executed process runs on, as JSON
PROBE = str(Path(__file__).with_name("blas_probe.py"))


@dataclass(frozen=True)
class Candidate:
    name: str
    library: str | None  # None: the wheel's reference BLAS, nothing preloaded
    defaults: dict[str, str] = field(default_factory=dict)  # environment it gets when unset

    @property
    def label(self) -> str:
        return LABELS[self.name]


@dataclass(frozen=True)
class Choice:
    candidate: Candidate
    chosen_by: str  # "measurement", "option" (--blas), "env" (HEARTH_BLAS) or "fallback"
    note: str = ""  # a warning worth a line on stderr
    measured: bool = False  # measured at this start (not read from the cache)


def _first(paths) -> str | None:
    return next((p for p in paths if os.path.exists(p)), None)


def find_openblas() -> str | None:
    return _first(OPENBLAS_CANDIDATES)


def find_mkl() -> str | None:
    """libmkl_rt from the `mkl` wheel in this environment, else a system one."""
    wheel = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so.*")))
    return _first([*wheel, *MKL_SYSTEM])


def installed() -> list[Candidate]:
    """The candidates present on this machine, the fallback (OpenBLAS) first."""
    found = [Candidate("openblas", find_openblas()), Candidate("mkl", find_mkl()),
             Candidate("blis", _first(BLIS_CANDIDATES), {"BLIS_NUM_THREADS": str(os.cpu_count() or 1)})]
    return [c for c in found if c.library] + [Candidate("reference", None)]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -- the environment a library runs with ---------------------------------------
def _known_libraries() -> set[str]:
    return {*OPENBLAS_CANDIDATES, *BLIS_CANDIDATES, *MKL_SYSTEM, *(c.library or "" for c in installed())}


def preload_env(candidate: Candidate, environ: dict[str, str]) -> dict[str, str]:
    """`environ` with `candidate` preloaded ahead of any other preload (a BLAS
    preloaded before is taken out) and its defaults where unset."""
    known = _known_libraries()
    kept = [p for p in environ.get("LD_PRELOAD", "").split(":") if p and p not in known]
    env = {k: v for k, v in environ.items() if k not in (INFO_ENV, "LD_PRELOAD")}
    preload = ([candidate.library] if candidate.library else []) + kept
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    for key, value in candidate.defaults.items():
        env.setdefault(key, value)
    return env


def launch_env(choice: Choice, environ: dict[str, str]) -> dict[str, str]:
    """The environment `hearth` re-executes itself with."""
    env = preload_env(choice.candidate, environ)
    given = sorted(k for k in choice.candidate.defaults if k not in environ)  # not the user's: not in the cache key
    env[INFO_ENV] = json.dumps({"name": choice.candidate.name, "library": choice.candidate.library,
                                "chosen_by": choice.chosen_by, "defaults": given})
    env["_HEARTH_REEXEC"] = "1"
    return env


# -- measuring -------------------------------------------------------------------
def measure(candidate: Candidate, budget_s: float | None = None) -> dict:
    """One candidate's GFLOP/s per row count and score, in a child process
    with it preloaded; `ok` false and an `error` when it was rejected."""
    budget = budget_s if budget_s is not None else float(os.environ.get("_HEARTH_BLAS_PROBE_S") or BUDGET_S)
    row: dict = {"name": candidate.name, "library": candidate.library, "ok": False, "gflops": {}, "score": 0.0}
    args = json.dumps({"library": candidate.library, "budget_s": budget, "shapes": SHAPES})
    try:
        done = procs.run([sys.executable, PROBE, args], env=preload_env(candidate, dict(os.environ)),
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"no answer in {PROBE_TIMEOUT_S} s"}
    except OSError as exc:
        return {**row, "error": str(exc)}
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {**row, "error": why[:300]}
    if not answer.get("ok"):
        return {**row, "error": str(answer.get("error"))[:300]}
    rates = answer["gflops"]
    return {**row, "ok": True, "gflops": rates, "score": _score(rates)}


def cache_key(candidates: list[Candidate]) -> dict:
    """What a measurement depends on; a cached one counts only while all of it holds."""
    from importlib.metadata import PackageNotFoundError, version

    def identity(c: Candidate) -> list:
        if not c.library:
            return [c.name]
        st = os.stat(c.library)
        return [c.name, c.library, st.st_size, st.st_mtime_ns]

    try:
        mlx_version = version("mlx")
    except PackageNotFoundError:
        mlx_version = ""
    return {"cpu": cpu_model(), "cores": os.cpu_count() or 1, "machine": platform.machine(), "mlx": mlx_version,
            "probe": PROBE_VERSION, "libraries": [identity(c) for c in candidates],
            "env": _user_settings()}


def _user_settings() -> dict[str, str]:
    """The BLAS settings in the environment, less the defaults `hearth` gave the library it runs on."""
    ours = set(_info().get("defaults") or ())
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(PASSED_ON) and k not in ours}


def _info() -> dict:
    try:
        info = json.loads(os.environ.get(INFO_ENV) or "{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def read_cache(path: Path, key: dict) -> dict | None:
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("key") == key else None


def _score(rates: dict) -> float:
    return round(math.exp(sum(math.log(max(v, 1e-9)) for v in rates.values()) / len(rates)), 2)


def _merge(rows: list[dict]) -> dict:
    """One candidate's rounds as one row: the best rate per size; rejected if any round was."""
    failed = next((r for r in rows if not r["ok"]), None)
    if failed is not None:
        return failed
    rates = {m: max(r["gflops"][m] for r in rows) for m in rows[0]["gflops"]}
    return {**rows[0], "gflops": rates, "score": _score(rates)}


def _cpu_seconds() -> tuple[float, float]:
    """(CPU seconds every process on the machine has used, those of this process and its reaped children)."""
    import resource

    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait
    except (OSError, ValueError, IndexError):
        busy = 0.0
    own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    return busy, own


def measure_all(candidates: list[Candidate], path: Path, say: Callable[[str], None] = lambda _: None,
                rounds: int = ROUNDS) -> dict:
    """Measure every candidate (in `rounds` interleaved passes, each size
    keeping its best rate, so a burst of other work hurts one pass only),
    pick the best score, and cache the record unless nothing passed (then
    the next start tries again). `others_cpu` is the share of the machine's
    CPU that other processes used meanwhile: a busy machine measures low."""
    key = cache_key(candidates)
    started, (busy0, own0) = time.monotonic(), _cpu_seconds()
    passes = [[measure(c) for c in candidates] for _ in range(rounds)]
    (busy1, own1), wall = _cpu_seconds(), time.monotonic() - started
    others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * (os.cpu_count() or 1)) if busy1 else None
    results = [_merge([p[i] for p in passes]) for i in range(len(candidates))]
    for r in results:
        say(f"  {r['name']:9} " + (f"score {r['score']:7.1f}  GFLOP/s at M=" +
                                    ", ".join(f"{m}: {v}" for m, v in r["gflops"].items())
                                    if r["ok"] else f"rejected: {r['error']}"))
    if others is not None and others > BUSY:
        say(f"  other processes used {others:.0%} of the CPU meanwhile; `hearth blas --measure` on a quiet "
            "machine measures again")
    passed = [r for r in results if r["ok"]]
    best = max(passed, key=lambda r: r["score"])["name"] if passed else None
    record = {"key": key, "measured_at": time.time(), "seconds": round(wall, 2),
              "others_cpu": None if others is None else round(others, 3),
              "shapes": [list(s) for s in SHAPES], "results": results, "best": best}
    if best is not None:
        try:
            write_atomically(Path(path), json.dumps(record, indent=1), durable=False)  # measured again if lost
        except OSError as exc:
            say(f"  (could not cache the measurement in {path}: {exc})")
    return record


# -- choosing ---------------------------------------------------------------------
def choose(requested: str, source: str, cache_path: Path, remeasure: bool = False,
           say: Callable[[str], None] = lambda _: None, candidates: list[Candidate] | None = None) -> Choice:
    """The library to run on. `requested` is one of CHOICES, from `source`
    ("option" or "env"); a named library that is not installed is chosen
    by measurement instead, with a note saying so. `candidates` defaults to
    the installed ones; the fallback is always OpenBLAS when installed."""
    if requested not in CHOICES:
        raise ValueError(f"must be one of {', '.join(CHOICES)}, not {requested!r}")
    candidates = installed() if candidates is None else candidates
    by_name = {c.name: c for c in candidates}
    note = ""
    if requested != "auto":
        if requested in by_name:
            return Choice(by_name[requested], source)
        hint = " (pip install 'hearth[mkl]')" if requested == "mkl" else ""
        note = f"{LABELS[requested]} is not installed here{hint}; choosing by measurement"
    openblas = find_openblas()
    fallback = Candidate("openblas", openblas) if openblas else Candidate("reference", None)
    if len(candidates) == 1 and candidates[0].library is None:  # the bundled BLAS alone: nothing to measure
        return Choice(candidates[0], "fallback", note)
    record = None if remeasure else read_cache(cache_path, cache_key(candidates))
    measured = record is None
    if record is None:
        say("measuring the BLAS libraries installed here (once per machine and HEARTH_HOME; cached in "
            f"{cache_path})")
        record = measure_all(candidates, cache_path, say)
    best = by_name.get(record.get("best") or "")
    if best is None:
        why = "no BLAS library passed its measurement; falling back to " + fallback.label
        return Choice(fallback, "fallback", f"{note}; {why}" if note else why, measured)
    return Choice(best, "measurement", note, measured)


# -- reporting --------------------------------------------------------------------
def current() -> dict:
    """What this process runs on: name, library and how it was chosen."""
    if sys.platform == "darwin":
        return {"name": "accelerate", "library": None, "chosen_by": "platform"}
    info = _info()
    preloaded = os.environ.get("LD_PRELOAD", "").split(":")
    if info.get("name") in NAMES and (info.get("library") is None or info.get("library") in preloaded):
        return {"name": info.get("name"), "library": info.get("library"), "chosen_by": info.get("chosen_by")}
    for c in installed():
        if c.library and c.library in preloaded:
            return {"name": c.name, "library": c.library, "chosen_by": "LD_PRELOAD"}
    return {"name": "reference", "library": None, "chosen_by": "default"}


def report(cache_path: Path) -> dict:
    """The `blas` object of /stats: the library in use, how it was chosen,
    and the measurement on file for this machine (`measured_at` None and no
    candidates when there is none, or it no longer holds)."""
    body = current()
    body["label"] = LABELS.get(body["name"] or "", body["name"])
    body["overridden"] = body["chosen_by"] in ("option", "env")
    body.update(measured_at=None, shapes=None, others_cpu=None, candidates=[])
    if sys.platform == "linux":
        record = read_cache(cache_path, cache_key(installed()))
        if record is not None:
            body["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record["measured_at"]))
            body["shapes"] = record.get("shapes")
            body["others_cpu"] = record.get("others_cpu")
            body["candidates"] = [{k: r.get(k) for k in ("name", "library", "ok", "gflops", "score", "error")}
                                  for r in record["results"]]
    return body


def blas_in_use() -> str:
    """One line for the logs: which BLAS this process runs on."""
    now = current()
    if now["name"] == "accelerate":
        return "Accelerate (macOS)"
    if now["name"] == "reference":
        return ("reference BLAS (slow: install libopenblas0-pthread or the `mkl` extra, or drop "
                "--blas reference / HEARTH_BLAS=reference)")
    how = {"measurement": "chosen by measurement", "option": "chosen with --blas", "env": "chosen with HEARTH_BLAS",
           "fallback": "the fallback"}.get(now["chosen_by"], f"from {now['chosen_by']}")
    return f"{LABELS[now['name']]} (preloaded {now['library']}; {how})"
