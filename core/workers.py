"""Work that may never end, run where it can be stopped.

Some work a client can make endless with a few bytes: a Jinja template of
three nested loops, a grammar whose compile explodes. A thread running it
cannot be interrupted, so such work runs in a `WorkerPool`: `size`
processes of one program (started by `core.procs.spawn`, so they end with
their parent), each doing one job at a time. A job has a time budget; past
it, or once its caller cancels it (`Ticket.cancel`), its worker is killed
and a fresh one takes its place, so a hostile job holds one worker for one
budget and nothing else.

A worker speaks JSON lines: an optional hello line first (what every job of
the pool shares, such as a tokenizer's description), then one line answered
`{"ready": true}` once it is set up, then one answer line per job line.

The pool is driven from threads (one per worker at most, as the caller's
executor provides); each thread owns its worker's pipes while it runs a
job, and other threads only ever send a kill signal.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import json
import os
import select
import subprocess
import threading
import time
from collections.abc import Sequence

from core.procs import SECRET_ENV, spawn

STARTUP_S = 60.0  # a worker's start (its imports) is not charged to a job's budget


class Worker:
    """One process of a pool."""

    def __init__(self, argv: Sequence[str], hello: bytes = b""):
        self.proc = spawn(list(argv), hide=SECRET_ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both asked for as pipes
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        self._buffer = b""
        self._hello = hello
        self.ready = False

    def signal_kill(self) -> None:
        """Stop it now; safe from any thread (the driving thread sees end of file)."""
        try:
            self.proc.kill()
        except OSError:
            pass

    def close(self) -> None:
        """Kill, reap and close its pipes: the driving thread only."""
        self.signal_kill()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (self._stdin, self._stdout):
            try:
                pipe.close()
            except OSError:
                pass

    def _line(self, deadline: float) -> dict | None:
        """The next answer line, or None once the deadline passes or the process is gone."""
        fd = self._stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def wait_ready(self) -> bool:
        if not self.ready:
            try:
                if self._hello:
                    self._stdin.write(self._hello)
                    self._stdin.flush()
                self.ready = self._line(time.monotonic() + STARTUP_S) is not None
            except (OSError, ValueError):
                return False
        return self.ready

    def roundtrip(self, payload: bytes, deadline: float) -> dict | None:
        try:
            self._stdin.write(payload)
            self._stdin.flush()
            return self._line(deadline)
        except (OSError, ValueError):  # killed meanwhile: a broken pipe, or a line cut short
            return None


class Ticket:
    """One job: the worker it runs on, and whether its caller gave it up."""

    def __init__(self):
        self.lock = threading.Lock()
        self.worker: Worker | None = None
        self.cancelled = False

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            if self.worker is not None:
                self.worker.signal_kill()


class WorkerPool:
    """Up to `size` processes running `argv`. `warm` starts them all now (so
    the first job does not wait for a start); otherwise each starts when a
    job first needs it, and stays for the next."""

    def __init__(self, argv: Sequence[str], size: int, *, hello: bytes = b"", warm: bool = True):
        self.argv, self.size, self.hello, self.warm = list(argv), size, hello, warm
        self._lock = threading.Lock()
        self._closed = False
        self._idle: list[Worker] = [Worker(self.argv, hello) for _ in range(size)] if warm else []
        self._busy: set[Worker] = set()
        self.killed = 0  # workers stopped mid-job (out of time, or cancelled)

    def run(self, message: dict, budget_s: float, ticket: Ticket | None = None,
            queued: float | None = None) -> dict | None:
        """Run one job (blocking: call it from a thread of the caller's own,
        at most `size` of them). The worker's answer, or None when the job
        ran out of its budget (counted from `queued` when given, so time
        spent waiting for a thread counts), was cancelled, or its worker
        broke. The worker's own start is not charged to the budget."""
        ticket = ticket or Ticket()
        if ticket.cancelled or (queued is not None and time.monotonic() - queued > budget_s):
            return None
        with self._lock:
            if self._closed:
                return None
            worker = self._idle.pop() if self._idle else Worker(self.argv, self.hello)
            self._busy.add(worker)
        payload = (json.dumps(message, ensure_ascii=False) + "\n").encode()
        answer, used = None, False
        try:
            if worker.wait_ready():
                with ticket.lock:
                    ticket.worker = None if ticket.cancelled else worker
                    used = ticket.worker is not None
                if used:
                    answer = worker.roundtrip(payload, time.monotonic() + budget_s)
        finally:
            with ticket.lock:
                ticket.worker = None
            if used and answer is None:
                self.killed += 1
            broken = (used and answer is None) or not worker.ready or worker.proc.poll() is not None
            with self._lock:
                self._busy.discard(worker)
                keep = not broken and not self._closed
                if keep:
                    self._idle.append(worker)
                elif self.warm and not self._closed:
                    self._idle.append(Worker(self.argv, self.hello))  # warm again for the next job
            if not keep:
                worker.close()  # out of time, killed for a caller that left, broken, or the pool closed
        return answer

    def close(self) -> None:
        """Kill every worker now, busy ones included (their jobs answer None
        at once); never waits on a job."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
        for worker in busy:
            worker.signal_kill()
        for worker in idle:
            worker.close()

    def alive(self) -> int:
        """How many of its processes are running."""
        with self._lock:
            return sum(w.proc.poll() is None for w in [*self._idle, *self._busy])


def confine(memory_bytes: int) -> None:
    """In a worker process, first thing: end with the parent (SIGKILL), and
    cap its address space at `memory_bytes` where the OS allows it."""
    import signal

    from core.procs import die_with_parent, tie_to_spawner

    if tie_to_spawner() is None:
        die_with_parent(signal.SIGKILL)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    except (ImportError, ValueError, OSError):
        pass
