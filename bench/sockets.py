#!/usr/bin/env python
"""Many chat sockets and many streams at once, against a real server.

    .venv/bin/python bench/sockets.py [--sockets 200] [--streams 200] [--url URL --pid PID]

Without --url it builds the tests' tiny model (`tests/helpers.build_tiny_model`) in a temporary
HF_HOME and starts `hearth serve --no-worker --max-tokens 32` on it; the server is stopped at the end.

First --chats chats are stored (new_session frames), as on a dashboard that has been used: each socket lists
up to 200 as it opens. Phase 1, /ws/chat: --sockets connections at once, a mix of: `turn` (asks a question, reads to
`turn_end`), `idle` (connects and holds), `drop` (asks, then closes at once) and `deaf` (a raw socket that
asks and never reads a byte). Phase 2, --streams SSE streams at once, half `/v1/chat/completions`, half
`/v1/responses`, half of each closed after three chunks. Through both a victim process streams a short
chat on its own connection in a loop; its time to first token and total are compared with a quiet run.

The server process is sampled every 0.25 s (RSS, open fds, threads); after each phase the probe waits
for /stats to show no live stream, engine row or queued request, then samples it again. After phase 1 it
reads the chat database: a question without an answer is a stuck turn. It prints one JSON report.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.device import running  # noqa: E402

MODEL = "hearth-test/tiny-random"


# -- the server --------------------------------------------------------------
def server_command(work: Path, port: int) -> tuple[list[str], dict]:
    """The command and environment of a server of the tiny model in `work` (built there)."""
    from tests.helpers import build_tiny_model

    build_tiny_model(work / "hf" / "hub")
    env = {**os.environ, "HF_HOME": str(work / "hf"), "HEARTH_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1"}
    return [sys.executable, "-m", "hearth.cli", "serve", MODEL, "--no-worker", "--max-tokens", "32",
            "--port", str(port)], env


class Sampler(threading.Thread):
    """The server's RSS (MiB), open fds and threads, every 0.25 s."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, int, int]] = []
        self.stop = threading.Event()

    def one(self) -> tuple[float, int, int]:
        return (round(self.proc.memory_info().rss / 2**20, 1), self.proc.num_fds(), self.proc.num_threads())

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.samples.append(self.one())

    def peak(self) -> dict:
        s = self.samples or [self.one()]
        return {"rss_mib": max(x[0] for x in s), "fds": max(x[1] for x in s), "threads": max(x[2] for x in s)}


def snapshot(sampler: Sampler) -> dict:
    rss, fds, threads = sampler.one()
    return {"rss_mib": rss, "fds": fds, "threads": threads}


def settled(url: str, timeout: float = 180) -> tuple[dict, float]:
    """/stats once nothing runs or waits (and how long that took)."""
    start = time.monotonic()
    while True:
        stats = httpx.get(url + "/stats", timeout=30).json()
        busy = (stats["streams"]["live"], stats["engine"]["active"], stats["engine"]["queued"],
                stats["batch"]["active_rows"], stats["batch"]["pending_rows"], stats["admission"]["queued"])
        if not any(busy) or time.monotonic() - start > timeout:
            return stats, round(time.monotonic() - start, 1)
        time.sleep(0.5)


def stats_view(stats: dict) -> dict:
    return {"streams_live": stats["streams"]["live"], "streams_following": stats["streams"]["following"],
            "engine_active": stats["engine"]["active"], "engine_queued": stats["engine"]["queued"],
            "active_rows": stats["batch"]["active_rows"], "pending_rows": stats["batch"]["pending_rows"],
            "admission_queued": stats["admission"]["queued"], "requests_total": stats["engine"]["requests_total"]}


# -- the victim ----------------------------------------------------------------
def victim(url: str, ready, stop, out) -> None:
    """Stream a 16-token chat in a loop on one connection until told to stop; (ttft, total, status) each."""
    ready.set()
    body = {"model": MODEL, "stream": True, "max_tokens": 16, "messages": [{"role": "user", "content": "Hello there"}]}
    with httpx.Client(timeout=300) as client:
        while not stop.is_set():
            start = time.perf_counter()
            first = None
            try:
                with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    for line in r.iter_lines():
                        if first is None and line.startswith("data: ") and '"content"' in line:
                            first = time.perf_counter() - start
                    status = r.status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            out.put((first, time.perf_counter() - start, status))


class Victim:
    def __init__(self, url: str):
        ctx = mp.get_context("spawn")
        self.ready, self.stop, self.out = ctx.Event(), ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=victim, args=(url, self.ready, self.stop, self.out), daemon=True)

    def __enter__(self):
        self.proc.start()
        self.ready.wait(120)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.proc.join(600)
        self.rows = []
        while not self.out.empty():
            self.rows.append(self.out.get())

    def report(self) -> dict:
        ttft = [r[0] for r in self.rows if r[0] is not None]
        total = [r[1] for r in self.rows]
        return {"replies": len(self.rows), "statuses": dict(Counter(str(r[2]) for r in self.rows)),
                "ttft_median_s": round(statistics.median(ttft), 3) if ttft else None,
                "ttft_worst_s": round(max(ttft), 3) if ttft else None,
                "total_median_s": round(statistics.median(total), 3) if total else None,
                "total_worst_s": round(max(total), 3) if total else None}


def quiet_victim(url: str, seconds: float = 8) -> dict:
    with Victim(url) as v:
        time.sleep(seconds)
    return v.report()


# -- phase 1: sockets ----------------------------------------------------------
def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws/chat"


WAITS: dict[str, list[float]] = {"ready": [], "turn_start": []}  # seconds from connecting / asking


async def sock_turn(url: str, i: int) -> str:
    try:
        start = time.perf_counter()
        async with websockets.connect(ws_url(url), open_timeout=120, max_size=8 << 20) as ws:
            for _ in range(2):  # ready, sessions
                json.loads(await asyncio.wait_for(ws.recv(), 120))
                if not _:
                    WAITS["ready"].append(time.perf_counter() - start)
            await ws.send(json.dumps({"type": "prompt", "text": f"Hello number {i}"}))
            asked = time.perf_counter()
            errors = []
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 300))
                if frame["type"] == "turn_start":
                    WAITS["turn_start"].append(time.perf_counter() - asked)
                if frame["type"] == "error":
                    errors.append(frame.get("error", {}).get("message") or frame.get("message") or str(frame))
                if frame["type"] == "turn_end":
                    if errors:
                        return "error: " + errors[0][:80]
                    return "aborted" if frame.get("aborted") else "answered"
                if frame["type"] == "error" and not frame.get("sessionId") and "turn" not in str(frame):
                    return "error: " + errors[0][:80]
    except websockets.ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else None}"
    except (asyncio.TimeoutError, TimeoutError):
        return "timeout"
    except Exception as exc:  # refused, reset: counted by kind
        return type(exc).__name__


async def sock_idle(url: str, hold: asyncio.Event) -> str:
    try:
        async with websockets.connect(ws_url(url), open_timeout=120) as ws:
            await ws.recv()
            await hold.wait()
            return "idle held"
    except Exception as exc:
        return type(exc).__name__


async def sock_drop(url: str, i: int) -> str:
    try:
        async with websockets.connect(ws_url(url), open_timeout=120) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "prompt", "text": f"Bye {i}"}))
        return "dropped"
    except Exception as exc:
        return type(exc).__name__


def _masked(payload: bytes) -> bytes:
    mask = os.urandom(4)
    head = bytes([0x81])
    n = len(payload)
    head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[k % 4] for k, b in enumerate(payload))


async def sock_deaf(url: str, i: int, hold: asyncio.Event) -> str:
    """A raw socket: the handshake, one prompt frame, then not a byte read (its receive buffer kept small)."""
    host, port = url.split("//")[1].split(":")
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(raw, (host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        await loop.sock_sendall(raw, (f"GET /ws/chat HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                                      f"Sec-WebSocket-Version: 13\r\nOrigin: {url}\r\n\r\n").encode())
        await loop.sock_sendall(raw, _masked(json.dumps({"type": "prompt", "text": f"Deaf {i}"}).encode()))
        await hold.wait()
        return "deaf held"
    except OSError as exc:
        return type(exc).__name__
    finally:
        raw.close()


async def phase_sockets(url: str, n: int) -> dict:
    hold = asyncio.Event()
    kinds = ["turn"] * 6 + ["idle", "drop", "drop", "deaf"]  # of every 10: 6 turns, 1 idle, 2 drops, 1 deaf
    tasks = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        coro = (sock_turn(url, i) if kind == "turn" else sock_idle(url, hold) if kind == "idle"
                else sock_drop(url, i) if kind == "drop" else sock_deaf(url, i, hold))
        tasks.append((kind, asyncio.ensure_future(coro)))
    turns = [t for k, t in tasks if k in ("turn", "drop")]
    await asyncio.wait(turns, timeout=600)
    hold.set()
    out: dict = {}
    for kind, task in tasks:
        result = await task
        out.setdefault(kind, Counter())[result] += 1
    report: dict = {k: dict(v) for k, v in out.items()}
    for name, waits in WAITS.items():
        if waits:
            report[f"{name}_median_s"] = round(statistics.median(waits), 2)
            report[f"{name}_worst_s"] = round(max(waits), 2)
    return report


async def seed_chats(url: str, n: int) -> None:
    """`n` stored chats, as a dashboard that has been used has (each socket lists up to 200 as it opens)."""
    async with websockets.connect(ws_url(url), max_size=8 << 20) as ws:
        await ws.recv()
        await ws.recv()
        for _ in range(n):
            await ws.send(json.dumps({"type": "new_session"}))
            while json.loads(await ws.recv())["type"] != "sessions":
                pass


def stuck_turns(home: Path) -> dict:
    """Questions with no answer under them, and sessions in all."""
    db = sqlite3.connect(f"file:{home / 'hearth.sqlite3'}?mode=ro", uri=True)
    try:
        sessions = db.execute("select count(*) from chat_chatsession").fetchone()[0]
        unanswered = db.execute("select count(*) from chat_chatentry q where q.role = 'user' and not exists "
                                "(select 1 from chat_chatentry a where a.parent_id = q.id)").fetchone()[0]
    finally:
        db.close()
    return {"sessions": sessions, "unanswered_questions": unanswered}


# -- phase 2: SSE streams --------------------------------------------------------
RESPONSE_ENDS = ("completed", "incomplete", "failed")  # a Responses stream's last event

async def one_stream(client: httpx.AsyncClient, url: str, route: str, i: int, leave: bool) -> str:
    body = ({"model": MODEL, "stream": True, "max_tokens": 32, "messages": [{"role": "user", "content": f"Hi {i}"}]}
            if route == "chat" else {"model": MODEL, "stream": True, "max_output_tokens": 32, "input": f"Hi {i}"})
    path = "/v1/chat/completions" if route == "chat" else "/v1/responses"
    try:
        async with client.stream("POST", url + path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return f"{r.status_code} {r.text[:80]}"
            chunks = 0
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    chunks += 1
                    if leave and chunks >= 3:
                        return "left"
                    if line == "data: [DONE]" or any(f'"response.{end}"' in line for end in RESPONSE_ENDS):
                        return "done"
            return "ended without its last event"
    except httpx.HTTPError as exc:
        return type(exc).__name__


async def phase_streams(url: str, n: int) -> dict:
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        jobs = []
        for i in range(n):
            route = "chat" if i % 2 == 0 else "responses"
            leave = (i // 2) % 2 == 1
            jobs.append((f"{route} {'leaves' if leave else 'reads'}",
                         asyncio.ensure_future(one_stream(client, url, route, i, leave))))
        out: dict = {}
        for kind, task in jobs:
            out.setdefault(kind, Counter())[await task] += 1
    return {k: dict(v) for k, v in out.items()}


# -- the run ---------------------------------------------------------------------
def phase(name: str, url: str, sampler: Sampler, run, home: Path | None, log: Path | None) -> dict:
    killed = log.read_text(errors="replace").count("took too long to shut down") if log is not None else 0
    before = snapshot(sampler)
    sampler.samples.clear()
    start = time.monotonic()
    with Victim(url) as v:
        outcome = asyncio.run(run())
    took = round(time.monotonic() - start, 1)
    peak = sampler.peak()
    stats, waited = settled(url)
    time.sleep(3)
    report = {"phase": name, "seconds": took, "outcome": outcome, "before": before, "peak": peak,
              "after": snapshot(sampler), "settled_after_s": waited, "stats_after": stats_view(stats),
              "victim": v.report()}
    if home is not None:
        report["db"] = stuck_turns(home)
    if log is not None:  # daphne gave up on a socket's app instance (application_close_timeout) and killed it
        report["apps_killed"] = log.read_text(errors="replace").count("took too long to shut down") - killed
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sockets", type=int, default=200)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--chats", type=int, default=200, help="chats stored before the sockets open")
    ap.add_argument("--url", help="a running server (it must serve the tiny model); needs --pid")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--home", type=Path, help="the running server's HEARTH_HOME (for the stuck-turn count)")
    ap.add_argument("--log", type=Path, help="the running server's log (for daphne's killed sockets)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hearth-sockets-"))  # the model, HEARTH_HOME and log of its own server
    try:
        reports = run(args, work)
    except BaseException:
        print(f"the server's home and log are kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(reports, indent=1))
    return 0


def run(args, work: Path) -> list[dict]:
    """The phases against the server `args` names, or one started in `work`; their reports."""
    with contextlib.ExitStack() as stack:
        if args.url:
            url, pid, home, log = args.url.rstrip("/"), args.pid, args.home, args.log
        else:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            cmd, env = server_command(work, port)
            log = work / "server.log"
            server = stack.enter_context(running(cmd, port, env, log=log))
            url, pid, home = f"http://127.0.0.1:{port}", server.pid, work / "home"
        sampler = Sampler(pid)
        sampler.start()
        stack.callback(sampler.stop.set)
        httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 4, "messages": [
            {"role": "user", "content": "warm"}]}, timeout=120)
        asyncio.run(seed_chats(url, args.chats))
        reports = [{"phase": "quiet victim", "victim": quiet_victim(url), "server": snapshot(sampler)}]
        if args.sockets:
            reports.append(phase("sockets", url, sampler, lambda: phase_sockets(url, args.sockets), home, log))
        if args.streams:
            reports.append(phase("streams", url, sampler, lambda: phase_streams(url, args.streams), None, log))
        return reports


if __name__ == "__main__":
    sys.exit(main())
