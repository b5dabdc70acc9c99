"""Admission: which waiting request the engine thread starts next, and when.

On the batched lane the number of rows decoding together follows the load
and the memory: a waiting request joins the running rows while there are
fewer than `row_ceiling` of them (`--batch N`, or `engine.AUTO_BATCH_MAX`
when `--batch` is left to `auto`) and the KV the rows hold now, plus the
newcomer's prompt and `GROWTH_TOKENS` of room for each row to grow, fits in
the memory left beside the weights, the prompt cache and a transient
reserve. So one client runs one row, 32 clients run 32, and when rows grow
long the batch stops taking new ones until some finish (an empty lane always
takes one: a prompt the context checks let in must run). The serial lane
runs one row. Up to `MAX_QUEUED` more wait, in arrival order; beyond that
`Engine.submit` raises `QueueFull` at once. With an
operator context cap (`max_context`, or one derived from `memory_budget`) a
prompt that leaves no room to generate is refused with `ContextOverBudget`;
one that fills the model's own context window, with `ContextLengthExceeded`
(both before any prefill); a prompt that fits has its token limit capped to
the room left.

Rows that run together share one adapter set (`adapters.AdapterManager`):
the set is resolved when a request is admitted, a request asking for a
different set waits until the running group has finished (and holds back
those behind it, so nobody starves), and its prompt-cache lookups stay in
its own namespace.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from inference.engine import loader
from inference.engine.adapters import Adapter, AdapterError, AdapterManager
from inference.engine.errors import ContextLengthExceeded, ContextOverBudget, EngineClosed, QueueFull
from inference.engine.rows import Generation, Row
from inference.engine.types import GenerationEvent, GenerationRequest

if TYPE_CHECKING:
    from inference.engine.speculate import AnyLane

log = logging.getLogger("hearth.engine")

MAX_QUEUED = 64
TRANSIENT_RESERVE = 256 << 20  # activations and scratch a budget keeps free besides weights and KV
GROWTH_TOKENS = 256  # KV room kept per running row beyond what it holds now


class Admission:
    """The requests waiting for a row, and the budget they are admitted
    against. `check_room`, `reserve` and `queued` serve any thread, the rest
    the engine thread only. The engine sets `row_ceiling`, `kv_room` and
    `enforced_context` while it sets up its lane."""

    def __init__(self):
        self.waiting: deque[Generation] = deque()  # engine thread only
        self._count = 0  # queue places taken: submitted, not yet admitted or dropped
        self._lock = threading.Lock()
        self.row_ceiling = 1  # the most rows the lane may run
        self.kv_room = 0  # bytes the running rows' KV may take; 0 = unchecked
        self.enforced_context: int | None = None
        self.held_for_memory = 0  # requests that waited because their KV would not fit yet
        self.group: tuple[Adapter, ...] = ()  # the adapters of the running rows

    # -- any thread ------------------------------------------------------
    @property
    def queued(self) -> int:
        """Requests admitted to the queue but not yet running."""
        return self._count

    def check_room(self, n: int, window: int | None) -> None:
        """Refuse a prompt of `n` tokens that leaves no room to generate, naming
        the tighter of the model's window and the operator's cap (the window
        on a tie): a full prefill would only end in `length` at once."""
        cap = self.enforced_context
        if window is not None and n >= window and (cap is None or window <= cap):
            raise ContextLengthExceeded(
                f"This model's maximum context length is {window} tokens. However, the prompt resulted in {n} "
                "tokens, which leaves no room to generate. Please reduce the length of the prompt.", n, window)
        if cap is not None and n >= cap:
            raise ContextOverBudget(
                f"the prompt has {n} tokens and the configured context limit is {cap} tokens, which leaves "
                "no room to generate; shorten the prompt or raise --max-context / --memory-budget / --kv-budget",
                n, cap)

    def reserve(self, closed: Callable[[], bool]) -> None:
        """Take a queue place for a request about to be submitted. Raises
        `EngineClosed` when `closed()` (asked under the lock `release_all`
        takes) and `QueueFull` while `MAX_QUEUED` requests wait."""
        with self._lock:
            if closed():
                raise EngineClosed("server is shutting down")
            if self._count >= MAX_QUEUED:
                raise QueueFull(f"generation queue is full ({MAX_QUEUED} requests waiting); retry later")
            self._count += 1

    # -- engine thread ---------------------------------------------------
    def sweep(self) -> None:
        """Forget waiting requests whose clients left, so they do not hold queue places."""
        if any(gen.aborted.is_set() for gen in self.waiting):
            kept = deque(gen for gen in self.waiting if not gen.aborted.is_set())
            with self._lock:
                self._count -= len(self.waiting) - len(kept)
            self.waiting = kept

    def admit(self, lane: AnyLane, model: loader.LoadedModel, adapters: AdapterManager,
              start: Callable[[Row], None]) -> None:
        """Hand `start` a row for each waiting request, in arrival order, while
        the first one fits beside the running rows and runs with their
        adapter set; aborted ones give up their place on the way."""
        while self.waiting:
            gen = self.waiting[0]
            req = gen.request
            if not gen.aborted.is_set() and not self._fits(lane, req, model.kv_bytes_per_token):
                if lane.active < self.row_ceiling:
                    self._count_held()
                return
            group: tuple[Adapter, ...] = ()  # read only once resolved: an aborted request is passed over
            if not gen.aborted.is_set():
                try:
                    group = adapters.resolve(req.adapters)
                except AdapterError as exc:  # unmounted while it waited
                    gen.emit(GenerationEvent(error=str(exc), error_status=exc.status, error_param=exc.param))
                    gen.aborted.set()
                else:
                    if lane.active and group != self.group:
                        return  # runs once the current group has finished
            self.waiting.popleft()
            with self._lock:
                self._count -= 1
            if gen.aborted.is_set():
                continue
            if not lane.active:
                self.use_group(adapters, group)
            row = Row(gen, model, self._limit(req, model.context_window), 0, lane.name)
            row.ns, row.adapters = adapters.namespace(group), group
            start(row)

    def use_group(self, adapters: AdapterManager, group: tuple[Adapter, ...]) -> None:
        """Make `group` the running adapter set, activating it when it changes."""
        if group != self.group:
            self.group = group
            adapters.activate(group)

    def _fits(self, lane: AnyLane, req: GenerationRequest, per_token: int) -> bool:
        """Whether one more row with this prompt fits beside the running rows."""
        if not lane.active:
            return True
        if lane.active >= self.row_ceiling:
            return False
        if not self.kv_room:
            return True
        need = (len(req.prompt_tokens) + GROWTH_TOKENS) * per_token
        return _kv_held(lane, per_token) + need <= self.kv_room

    def _count_held(self) -> None:
        """Every request waiting while memory holds admission, counted once."""
        for waiting in self.waiting:
            if not waiting.held:
                waiting.held = True
                self.held_for_memory += 1

    def _limit(self, req: GenerationRequest, window: int | None) -> int:
        """The request's cap, bounded by the context window and the operator cap."""
        n = len(req.prompt_tokens)
        caps = [req.max_tokens] if req.max_tokens is not None else []
        if window:
            caps.append(max(window - n, 1))
        if self.enforced_context is not None:
            caps.append(max(self.enforced_context - n, 1))
        return min(caps) if caps else 1 << 30

    def fail_all(self, message: str) -> None:
        """End every waiting request with `message` (their places stay taken until `release_all`)."""
        while self.waiting:
            self.waiting.popleft().emit(GenerationEvent(error=message))

    def release_all(self) -> None:
        """Free every queue place, once the engine has answered all the work that held one."""
        with self._lock:
            self._count = 0


def _kv_held(lane: AnyLane, per_token: int) -> int:
    """Bytes the running rows' KV holds now, each with room to grow."""
    return sum((len(r.req.prompt_tokens) + r.count + GROWTH_TOKENS) * per_token for r in lane.all_rows())


def kv_room(memory_budget: int | None, prompt_cache_bytes: int, model: loader.LoadedModel,
            draft: loader.LoadedModel | None) -> int:
    """Bytes the running rows' KV caches may take: the memory budget (the
    operator's, or three quarters of RAM) less the weights (a draft model's
    too), the prompt cache's cap and the transient reserve. 0 when it cannot
    be known."""
    budget = memory_budget or loader.memory_budget()
    if not budget or not model.kv_bytes_per_token:
        return 0
    used = model.weights_bytes + prompt_cache_bytes + TRANSIENT_RESERVE
    if draft is not None:
        used += draft.weights_bytes
    if budget <= used:
        log.warning("the memory budget (%d MiB) leaves no room for KV caches beside the weights, the prompt "
                    "cache and the reserve (%d MiB): requests will decode one at a time", budget >> 20,
                    used >> 20)
    return max(budget - used, 1)


def enforced_context(max_context: int | None, memory_budget: int | None, model: loader.LoadedModel,
                     kv_budget: int | None = None) -> int | None:
    """The operator's cap on prompt + generation tokens: `max_context`, what
    `memory_budget` leaves for KV beside the weights, or the tokens whose KV
    `kv_budget` holds, whichever is least."""
    caps = []
    if max_context:
        caps.append(max_context)
    if kv_budget is not None:
        caps.append(max(kv_budget // (model.kv_bytes_per_token or 1), 0))
    if memory_budget is not None:
        per_token = model.kv_bytes_per_token or 1
        room = memory_budget - model.weights_bytes - TRANSIENT_RESERVE
        caps.append(max(room // per_token, 0))
    return min(caps) if caps else None
