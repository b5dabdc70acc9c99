"""Client chat templates, rendered where they can be stopped.

A template is a program: three nested loops in forty bytes keep a Jinja
render busy for good, and a render running in one of the server's threads
cannot be interrupted. So a client's template (`chat_template_kwargs.
chat_template`, allowed only with `hearth serve --allow-client-templates`)
renders in a pool of `template_worker` processes of its own. A render waits
at most the template time budget for a free worker, then runs for at most
the budget; past it, or once the client has gone (the request's task is
cancelled), its worker is killed and a fresh one started in its place, so a
hostile template holds one worker for one budget and nothing else: the
server's own template, and every request without a client template, never
comes here.

Each worker is driven by one thread of a small executor of its own (one
thread per worker), so renders never take threads from the event loop's
default pool; the thread owns its worker's pipes, and the event loop only
ever sends a kill signal.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from core.procs import SECRET_ENV, spawn
from inference.protocols.errors import RequestError

log = logging.getLogger("hearth.templates")
PARAM = "chat_template_kwargs.chat_template"
STARTUP_S = 60.0  # a worker's start (importing transformers) is not charged to a render's budget


class _Worker:
    def __init__(self):
        self.proc = spawn([sys.executable, "-m", "inference.protocols.template_worker"], hide=SECRET_ENV,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both asked for as pipes
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        self._buffer = b""
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


class _Ticket:
    """One render: the worker it runs on, and whether its client left."""

    def __init__(self):
        self.lock = threading.Lock()
        self.worker: _Worker | None = None
        self.cancelled = False

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            if self.worker is not None:
                self.worker.signal_kill()


class TemplateSandbox:
    """A pool of `size` render processes with a per-render time budget."""

    def __init__(self, size: int = 2, timeout_s: float = 5.0):
        self.size, self.timeout_s = size, timeout_s
        self._lock = threading.Lock()
        self._idle: list[_Worker] = [_Worker() for _ in range(size)]  # started now, so warm when first needed
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="hearth-template")
        self.renders = self.timeouts = self.failures = 0

    async def render(self, template: str, messages: list[dict], tools: list[dict] | None, variables: dict,
                     max_chars: int) -> str:
        """The rendered prompt text, or RequestError (a 400 for the template's
        own errors, 503 when it ran out of time)."""
        payload = (json.dumps({"template": template, "messages": messages, "tools": tools, "variables": variables,
                               "max_chars": max_chars}, ensure_ascii=False) + "\n").encode()
        ticket = _Ticket()
        queued = time.monotonic()
        try:
            answer = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._render, payload, queued, ticket)
        except asyncio.CancelledError:  # the client left: stop the work it started (or will start)
            ticket.cancel()
            raise
        if answer is None:
            self.timeouts += 1
            raise RequestError(f"the chat template did not render within {self.timeout_s:g} s "
                               "(--template-timeout)", PARAM, status=503, kind="engine_unavailable",
                               code="template_timeout")
        if "error" in answer:
            self.failures += 1
            raise RequestError(f"prompt build failed: {answer['error']}", PARAM)
        self.renders += 1
        return answer["text"]

    def _render(self, payload: bytes, queued: float, ticket: _Ticket) -> dict | None:
        if ticket.cancelled or time.monotonic() - queued > self.timeout_s:
            return None  # its client left, or it waited its whole budget for a worker
        with self._lock:
            worker = self._idle.pop() if self._idle else _Worker()
        answer, used = None, False
        try:
            if worker.wait_ready():
                with ticket.lock:
                    ticket.worker = None if ticket.cancelled else worker
                    used = ticket.worker is not None
                if used:
                    answer = worker.roundtrip(payload, time.monotonic() + self.timeout_s)
        finally:
            with ticket.lock:
                ticket.worker = None
            if (used and answer is None) or not worker.ready or worker.proc.poll() is not None:
                worker.close()  # out of time, killed for a client that left, or broken: replaced
                worker = _Worker()
            with self._lock:
                self._idle.append(worker)
        return answer

    def stats(self) -> dict:
        return {"workers": self.size, "timeout_s": self.timeout_s, "renders": self.renders,
                "timeouts": self.timeouts, "failures": self.failures}

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.close()
