"""Work that needs the model to itself (the Curve Designer's /signal and
/generate): `Engine.exclusive(fn)` queues `fn`, and the engine thread runs
it with no request decoding beside it or interleaved with it.

How the engine keeps it alone, all on its own thread:
- while a solo call waits, admission pauses: queued requests stay queued
  (and count against the queue's bound as before);
- the rows already running, prefill included, run to their end;
- once the lane is empty the call runs, start to finish, between two
  iterations of the engine loop, so no decode step of anyone else's can
  happen until it returns;
- then admission resumes. Requests that waited are admitted before a
  second solo call runs, so a stream of calls cannot starve serving.

The caller gets a `concurrent.futures.Future`; cancelling it while the call
still waits takes it out of the queue (and unpauses admission if it was the
last). A call that has started runs to its end.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from inference.engine.errors import QueueFull

MAX_SOLO = 8  # solo calls waiting at once; more are refused with QueueFull


class Solo:
    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.future: Future = Future()


class SoloQueue:
    """The engine's waiting solo calls. `offer` runs on any thread, the rest
    on the engine thread."""

    def __init__(self):
        self._items: deque[Solo] = deque()  # engine thread only
        self._count = 0  # offered and not yet run or dropped
        self._lock = threading.Lock()
        self.just_ran = False  # a call ran since the last admission: requests that waited go first

    def offer(self, fn: Callable[[], Any]) -> Solo:
        with self._lock:
            if self._count >= MAX_SOLO:
                raise QueueFull(f"{MAX_SOLO} calls already wait for exclusive use of the model; retry later")
            self._count += 1
        return Solo(fn)

    def add(self, item: Solo) -> None:
        self._items.append(item)

    @property
    def pending(self) -> int:
        """Calls offered and not yet run or dropped (any thread)."""
        return self._count

    def __bool__(self) -> bool:
        """Whether a call has reached the engine and waits (engine thread)."""
        return bool(self._items)

    def sweep(self) -> None:
        """Forget calls whose callers gave up."""
        kept = deque(s for s in self._items if not s.future.cancelled())
        self._done(len(self._items) - len(kept))
        self._items = kept

    def holds_admission(self, waiting: bool) -> bool:
        """Whether admission pauses now: a call waits, and the requests that
        waited through the previous one (if any) have had their turn."""
        return bool(self._items) and not (self.just_ran and waiting)

    def run_next(self, prepare: Callable[[], None]) -> None:
        """Run the first call still wanted (after `prepare`), answering its future."""
        while self._items:
            item = self._items.popleft()
            self._done(1)
            if not item.future.set_running_or_notify_cancel():
                continue
            self.just_ran = True
            try:
                prepare()
                result = item.fn()
            except Exception as exc:  # the caller re-raises it
                item.future.set_exception(exc)
            except BaseException as exc:
                item.future.set_exception(exc)
                raise
            else:
                item.future.set_result(result)
            return

    def fail_all(self, error: Exception) -> None:
        while self._items:
            item = self._items.popleft()
            self._done(1)
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(error)

    def _done(self, n: int) -> None:
        with self._lock:
            self._count -= n
