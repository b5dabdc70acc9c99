"""How long a newcomer waits: a fresh clone's `make serve` timed to its first
streamed chat reply (install included), with empty homes, so the demo
model trains from nothing.

    python3 bench/first_answer.py [--no-pip-cache] [--port 8097]

Prints when the install ended, when the server answered /health, when the
first streamed reply came (each counted from the command) and which demo
checkpoint gave it. `--no-pip-cache` makes pip download every package again,
as on a machine that never installed Hearth. Stdlib only; stops the server
(and so everything it started) at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 1200


def _get(url: str, timeout: float = 2.0) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return json.load(answer)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _first_chunk(url: str) -> str | None:
    """The first content-bearing chunk of a streamed reply, or None while there is no model."""
    body = json.dumps({"messages": [{"role": "user", "content": "Hello!"}], "stream": True,
                       "max_tokens": 8}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            for raw in answer:
                line = raw.decode().strip()
                if line.startswith("data: {") and '"delta"' in line:
                    return line
    except (urllib.error.URLError, OSError):
        return None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-pip-cache", action="store_true")
    parser.add_argument("--port", type=int, default=8097)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hearth-first-"))
    clone = work / "hearth"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = dict(os.environ, HEARTH_HOME=str(work / "home"), HF_HOME=str(work / "hf"))
    if args.no_pip_cache:
        env["PIP_NO_CACHE_DIR"] = "1"
    url = f"http://127.0.0.1:{args.port}"
    log = open(work / "serve.log", "wb")
    started = time.monotonic()
    proc = subprocess.Popen(["make", "serve", f"PORT={args.port}"], cwd=clone, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    marks: dict[str, float] = {}
    try:
        while time.monotonic() - started < LIMIT_S and proc.poll() is None:
            now = time.monotonic() - started
            if "installed" not in marks and (clone / ".venv" / ".installed").exists():
                marks["installed"] = now
            if "health" not in marks and _get(url + "/health"):
                marks["health"] = now
            if "health" in marks:
                chunk = _first_chunk(url)
                if chunk:
                    marks["first reply"] = time.monotonic() - started
                    build = (_get(url + "/health") or {}).get("demo_build") or {}
                    print(f"first chunk: {chunk[:160]}")
                    print(f"served checkpoint: step {build.get('served_step')} of {build.get('steps')}")
                    break
            time.sleep(1.0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    for name, seconds in marks.items():
        print(f"{name:>12}: {seconds:6.1f} s after `make serve`")
    ok = "first reply" in marks
    if not ok:
        print("no reply within the limit; the log:", work / "serve.log", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
