"""Client chat templates, rendered where they can be stopped.

A template is a program: three nested loops in forty bytes keep a Jinja
render busy for good, and a render running in one of the server's threads
cannot be interrupted. So a client's template (`chat_template_kwargs.
chat_template`, allowed only with `hearth serve --allow-client-templates`)
renders in a pool of `template_worker` processes of its own
(`core.workers.WorkerPool`). A render waits at most the template time
budget for a free worker, then runs for at most the budget; past it, or
once the client has gone (the request's task is cancelled), its worker is
killed and a fresh one started in its place, so a hostile template holds
one worker for one budget and nothing else: the server's own template, and
every request without a client template, never comes here.

Each worker is driven by one thread of a small executor of its own (one
thread per worker), so renders never take threads from the event loop's
default pool.
"""
from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from core.workers import Ticket, WorkerPool
from inference.protocols.errors import RequestError

PARAM = "chat_template_kwargs.chat_template"


class TemplateSandbox:
    """A pool of `size` render processes with a per-render time budget."""

    def __init__(self, size: int = 2, timeout_s: float = 5.0):
        self.size, self.timeout_s = size, timeout_s
        # Started now, so warm when first needed.
        self._pool = WorkerPool([sys.executable, "-m", "inference.protocols.template_worker"], size)
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="hearth-template")
        self.renders = self.timeouts = self.failures = 0

    async def render(self, template: str, messages: list[dict], tools: list[dict] | None, variables: dict,
                     max_chars: int, continued: bool = False) -> str:
        """The rendered prompt text, or RequestError (a 400 for the template's
        own errors, 503 when it ran out of time). `continued`: the text ends
        inside the final assistant message (chat.continues), with no
        generation prompt."""
        job = {"template": template, "messages": messages, "tools": tools, "variables": variables,
               "max_chars": max_chars, "continued": continued}
        ticket = Ticket()
        try:
            answer = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._pool.run, job, self.timeout_s, ticket, time.monotonic())
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

    def stats(self) -> dict:
        return {"workers": self.size, "timeout_s": self.timeout_s, "renders": self.renders,
                "timeouts": self.timeouts, "failures": self.failures}

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._pool.close()
