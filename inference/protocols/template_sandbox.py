"""Client chat templates, rendered where they can be stopped.

A template is a program: three nested loops in forty bytes keep a Jinja
render busy for good, and a render running in one of the server's threads
cannot be interrupted. So a client's template (`chat_template_kwargs.
chat_template`, allowed only with `hearth serve --allow-client-templates`)
renders in a pool of `template_worker` processes of its own. A render
waits for a free worker and runs for at most the template time budget in
all; past it, or once the client has gone (the request's task is
cancelled), the worker is killed and a fresh one started, so a hostile
template costs one worker for the budget and nothing else. The server's
own template never comes here.

Waiting happens on a small executor of its own, one thread per worker, so
renders never take threads from the event loop's default pool.
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

from inference.protocols.errors import RequestError

log = logging.getLogger("hearth.templates")
PARAM = "chat_template_kwargs.chat_template"
SECRETS = ("HEARTH_API_KEY", "HEARTH_INTERNAL_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


class _Ticket:
    """One render: the worker it runs on, and whether its client left."""

    def __init__(self):
        self.worker: _Worker | None = None
        self.cancelled = False


class _Worker:
    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k not in SECRETS}
        self.proc = subprocess.Popen([sys.executable, "-m", "inference.protocols.template_worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0)
        self._buffer = b""
        self.ready = False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass

    def _line(self, deadline: float) -> dict | None:
        """The next answer line, or None once the deadline passes or the process is gone."""
        fd = self.proc.stdout.fileno()
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

    def roundtrip(self, payload: bytes, deadline: float) -> dict | None:
        if not self.ready:
            if self._line(deadline) is None:
                return None
            self.ready = True
        try:
            self.proc.stdin.write(payload)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return None
        return self._line(deadline)


class TemplateSandbox:
    """A pool of `size` render processes with a per-render time budget."""

    def __init__(self, size: int = 2, timeout_s: float = 5.0):
        self.size, self.timeout_s = size, timeout_s
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="hearth-template")
        self.renders = self.timeouts = self.failures = 0
        for _ in range(size):
            self._idle.append(_Worker())  # started now: the first render does not wait for imports

    async def render(self, template: str, messages: list[dict], tools: list[dict] | None, variables: dict,
                     max_chars: int) -> str:
        """The rendered prompt text, or RequestError (a 400 for the template's
        own errors, 503 when it ran out of time)."""
        payload = (json.dumps({"template": template, "messages": messages, "tools": tools, "variables": variables,
                               "max_chars": max_chars}, ensure_ascii=False) + "\n").encode()
        deadline = time.monotonic() + self.timeout_s
        ticket = _Ticket()
        try:
            answer = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._render, payload, deadline, ticket)
        except asyncio.CancelledError:  # the client left: stop the work it started
            ticket.cancelled = True
            if ticket.worker is not None:
                ticket.worker.kill()
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

    def _render(self, payload: bytes, deadline: float, ticket: _Ticket) -> dict | None:
        if not self._slots.acquire(timeout=max(deadline - time.monotonic(), 0)):
            return None
        worker = None
        try:
            if ticket.cancelled:
                return None
            with self._lock:
                worker = self._idle.pop() if self._idle else _Worker()
            ticket.worker = worker
            answer = None if ticket.cancelled else worker.roundtrip(payload, deadline)
            if answer is None or worker.proc.poll() is not None:
                worker.kill()  # out of time, or killed for a client that left: a fresh one takes its place
                worker = _Worker()
            return answer
        finally:
            if worker is not None:
                with self._lock:
                    self._idle.append(worker)
            self._slots.release()

    def stats(self) -> dict:
        return {"workers": self.size, "timeout_s": self.timeout_s, "renders": self.renders,
                "timeouts": self.timeouts, "failures": self.failures}

    def close(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)
