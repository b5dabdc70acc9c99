"""A request's thread for its synchronous code, lent from a pool.

Django runs each ASGI request in asgiref's `ThreadSensitiveContext`: the
request's thread-sensitive sync calls (sync middleware, the ORM from async
views, the `response.close()` Django ends every request with) share one
thread of their own. asgiref makes that thread for the request and, at its
end, starts another one to join it (3.13; earlier versions join it on the
event loop): two thread starts a request, each of which blocks the event
loop until the new thread first holds the GIL. With
the engine thread decoding, that wait was an eighth of the event loop's
busy time in a burst of short requests, and it delays every other stream.

`RequestContext` is the same context with the thread taken from a pool of
idle one-thread executors and given back when the request ends (once its
last call is done, should a cancelled await have left one running). Tasks
that outlive the request keep asgiref's behaviour: a thread-sensitive call
they make afterwards gets a thread of its own, as it did before. The pool
is the only place `SyncToAsync.context_to_thread_executor` (asgiref's map
of context to executor) is touched; asgiref's own executor argument is not
used because it refuses calls from such outliving tasks.
"""
from __future__ import annotations

import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor

from asgiref.sync import SyncToAsync, ThreadSensitiveContext

KEEP = 64  # idle threads kept for the next requests; a larger burst's extra threads end with it


class _Pool:
    def __init__(self) -> None:
        self._idle: list[Executor] = []
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0  # executors made

    def take(self) -> Executor:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.started += 1
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="hearth-request")

    def give_back(self, executor: Executor) -> None:
        """Back to the pool once the calls queued on it are done (this no-op runs after them)."""
        def idle(_: Future) -> None:
            with self._lock:
                if len(self._idle) < KEEP and not self._closed:
                    self._idle.append(executor)
                    return
            executor.shutdown(wait=False)

        try:
            executor.submit(_noop).add_done_callback(idle)
        except RuntimeError:  # the interpreter is shutting down: its executors are being joined
            return


    def close(self) -> None:
        """At server exit: the idle threads end now (one still running a call ends after it), so
        none of them is taken for a stuck one."""
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for executor in idle:
            executor.shutdown(wait=False)


def _noop() -> None:
    return None


POOL = _Pool()


class RequestContext(ThreadSensitiveContext):
    """asgiref's per-request context, on a pooled thread."""

    async def __aenter__(self):
        await super().__aenter__()
        if self.token is not None:  # the outermost context: the request's own
            SyncToAsync.context_to_thread_executor[self] = POOL.take()
        return self

    async def __aexit__(self, exc, value, tb):
        executor = SyncToAsync.context_to_thread_executor.pop(self, None) if self.token else None
        await super().__aexit__(exc, value, tb)  # with nothing to shut down, it starts no joining thread
        if executor is not None:
            POOL.give_back(executor)
