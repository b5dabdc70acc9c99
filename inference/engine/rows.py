"""One admitted request while it generates, on whichever lane runs it.

A `Row` turns sampled tokens into events: EOS is counted but never shown,
text is detokenized and held back while it could still become a stop
string, logprobs are attached when asked for, and the row says when it is
done (EOS, a stop string, a finished grammar or its token limit). A
`Generation` is the state a request's row shares with the asyncio side, and
a `Submission` is that side's handle on it: the events, abort and stop.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inference.engine import metrics
from inference.engine.sampling import logprob_entry
from inference.engine.textstream import StopMatcher
from inference.engine.types import EventStream, GenerationEvent, GenerationRequest, Usage

if TYPE_CHECKING:
    from inference.engine.loader import LoadedModel


class Mailbox:
    """A generation's events on their way from the engine thread to the one
    task that reads them on an event loop. Putting an event wakes the loop
    only when the reader is waiting for one: a reader busy writing its last
    chunk, or sleeping out its pace, takes what came meanwhile when it is
    back, and costs the loop no wake-up (a self-pipe write and a callback,
    20-40 us of the loop's time) for each token the engine made meanwhile.

    Hand-written because `asyncio.Queue` may only be touched on its loop:
    the engine thread would have to wake the loop for every put. The lock
    makes "nothing queued, so wait" and "queued, is anyone waiting?" one
    step each, so no event is left unseen by a waiting reader."""

    __slots__ = ("_items", "_lock", "_waiter")

    def __init__(self) -> None:
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._waiter: asyncio.Future | None = None

    def put(self, event: Any) -> asyncio.Future | None:
        """Queue `event` (any thread). Answers the reader's waiting future,
        which the caller must wake on the reader's loop (`wake`), or None
        when the reader is not waiting."""
        with self._lock:
            self._items.append(event)
            waiter, self._waiter = self._waiter, None
        return waiter

    def put_nowait(self, event: Any) -> None:
        """Queue `event` from the reader's own loop thread."""
        waiter = self.put(event)
        if waiter is not None:
            wake([waiter])

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> Any:
        """The oldest queued event; IndexError when there is none."""
        with self._lock:
            return self._items.popleft()

    async def get(self) -> Any:
        """The oldest event, waiting for one if none is queued."""
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                self._waiter = waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                with self._lock:
                    if self._waiter is waiter:  # cancelled while waiting: no one waits now
                        self._waiter = None


def wake(waiters: list[asyncio.Future]) -> None:
    """On the readers' loop: tell each waiting reader its event has come."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


@dataclass
class Generation:
    """One submitted request while it lives: its events go back to the loop
    that asked, and `aborted` says its client left."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: Mailbox = field(default_factory=Mailbox)
    aborted: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    # Set by the engine thread when it admits the request (None before): prompt tokens the cache served.
    cached: int | None = None
    admitted: float | None = None  # when the engine thread first put it on a lane (perf_counter)
    lane: str = "serial"
    held: bool = False  # it waited for memory at least once (engine thread only)

    def emit(self, event: GenerationEvent) -> None:
        pending = getattr(_gathering, "events", None)
        if pending is not None:  # inside `gathered()`: sent with the step's other events
            pending.append((self, event))
            return
        _deliver([(self, event)])


# The engine thread's events of one decode step, sent together when it ends (`gathered`).
_gathering = threading.local()


@contextlib.contextmanager
def gathered():
    """Events emitted inside reach their event loops together at the end:
    at most one wake-up of each loop per engine step (a self-pipe write and
    a callback), not one per token of every row, and none for a loop whose
    readers are all busy."""
    _gathering.events = []
    try:
        yield
    finally:
        events, _gathering.events = _gathering.events, None
        _deliver(events)


def _deliver(events: list[tuple[Generation, GenerationEvent]]) -> None:
    waiting: dict[asyncio.AbstractEventLoop, tuple[list[Generation], list[asyncio.Future]]] = {}
    for gen, event in events:
        if gen.loop.is_closed():  # nobody is listening
            gen.aborted.set()
            continue
        waiter = gen.events.put(event)
        if waiter is not None:
            gens, waiters = waiting.setdefault(gen.loop, ([], []))
            gens.append(gen)
            waiters.append(waiter)
    for loop, (gens, waiters) in waiting.items():
        try:
            loop.call_soon_threadsafe(wake, waiters)
        except RuntimeError:  # the loop closed just now
            for gen in gens:
                gen.aborted.set()


def _after_text(detok) -> None:
    """mlx-lm's BPE and SPM detokenizers drop a leading space from the first
    token of a reply (a reply's first word follows no text); one that goes on
    from text already written keeps it: the detokenizer is told text came
    before (a placeholder that `last_segment` never hands out)."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

    if isinstance(detok, (BPEStreamingDetokenizer, SPMStreamingDetokenizer)):
        detok.text, detok.offset = "\0", 1


class Row:
    def __init__(self, generation: Generation, model: LoadedModel, limit: int, cached: int, lane: str):
        self.generation = generation
        self.req = generation.request
        self.tokenizer = model.tokenizer
        self.eos = set(model.tokenizer.eos_token_ids)
        self.detok = model.tokenizer.detokenizer  # a fresh copy per access
        self.detok.reset()
        if self.req.continues:
            _after_text(self.detok)
        self.stops = StopMatcher(self.req.stop)
        self.limit = limit
        self.cached = cached
        self.lane = lane
        generation.lane = lane
        self.ns = ""  # the prompt-cache namespace of its adapter set
        self.adapters: tuple = ()  # that adapter set
        self.count = 0
        self.generated: list[int] = []  # what it has sampled so far, for a restart on a fresh lane
        # Made once, so a restarted seeded row keeps drawing from the same key.
        self.sampler: Callable[[Any], Any] | None = None
        self.fault: BaseException | None = None  # its own sampler, processors or detokenizer failed
        self.restarts = 0
        self.spec: dict | None = None  # speculation counters, once it has decoded speculatively
        self.fill: dict | None = None  # jump-forward counters, once it has decoded with jump-forward
        self.finish: str | None = None
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.detok_s = 0.0  # spent detokenizing and matching stop strings
        self.want_logprobs = self.req.logprobs or self.req.top_logprobs > 0

    @property
    def aborted(self) -> bool:
        return self.generation.aborted.is_set()

    def context(self) -> list[int]:
        """The tokens its KV cache stands for once it has taken what it sampled."""
        return list(self.req.prompt_tokens) + self.generated

    def key(self, tokens: list[int]) -> list[int]:
        """The prompt-cache key of `tokens` (this row's prompt, then what it
        generated): an image request's prompt part keyed by its images."""
        prompt = self.req.cache_key
        if prompt is None:
            return tokens
        n = len(prompt)
        return prompt[:len(tokens)] + list(tokens[n:])

    @property
    def remaining(self) -> int:
        return max(self.limit - self.count, 1)

    def feed(self, token: int, logprobs) -> bool:
        """Take one sampled token; True once the row is finished."""
        now = time.perf_counter()
        if self.last_at is None:  # the first token: both times are set together
            self.first_at = now
            metrics.TTFT.observe(now - self.generation.submitted)
        else:
            metrics.ITL.observe(now - self.last_at)
        self.last_at = now
        self.count += 1
        self.generated.append(token)
        metrics.GENERATED_TOKENS.inc()
        if token in self.eos:  # counted, never shown
            self.finish = "stop"
            return True
        detok_at = time.perf_counter()
        self.detok.add_token(token)
        text = self.stops.feed(self.detok.last_segment)
        self.detok_s += time.perf_counter() - detok_at
        entry = logprob_entry(self.tokenizer, token, logprobs, self.req.top_logprobs) if self.want_logprobs else None
        self.generation.emit(GenerationEvent(text=text, token_ids=(token,), logprobs=entry))
        grammar = self.req.grammar
        if self.stops.stopped or (grammar is not None and grammar.finished):
            self.finish = "stop"  # a stop string matched, or the grammar is complete
        elif self.count >= self.limit:
            self.finish = "length"
        return self.finish is not None

    def timings(self) -> dict:
        """Usage.timings: where this request's time went, in ms."""
        def ms(start: float | None, end: float | None) -> float:
            return round((end - start) * 1000, 2) if start is not None and end is not None else 0.0

        admitted = self.generation.admitted
        grammar = self.req.grammar
        return {"queue_ms": ms(self.generation.submitted, admitted), "prefill_ms": ms(admitted, self.first_at),
                "decode_ms": ms(self.first_at, self.last_at),
                "grammar_ms": round(grammar.mask_s * 1000, 2) if grammar is not None else 0.0,
                "detokenize_ms": round(self.detok_s * 1000, 2)}

    def close(self) -> None:
        """Send the last event: the held-back tail, finish reason and usage."""
        finish = self.finish or "length"
        metrics.GENERATIONS.labels(self.lane, finish).inc()
        if self.aborted:
            return
        self.detok.finalize()
        tail = self.stops.feed(self.detok.last_segment)  # nothing once a stop string matched
        if self.stops.stopped:
            finish = "stop"
        else:
            tail += self.stops.flush()
        usage = Usage(len(self.req.prompt_tokens), self.count, self.cached, self.lane,
                      dict(self.spec) if self.spec is not None else None, self.timings(),
                      {**self.fill, "spanLens": list(self.fill["spanLens"])} if self.fill is not None else None)
        self.generation.emit(GenerationEvent(text=tail, finish_reason=finish, usage=usage,
                                             stop_sequence=self.stops.matched))

    def fail(self, message: str) -> None:
        self.generation.emit(GenerationEvent(error=message))

    @property
    def decode_tps(self) -> float:
        if self.first_at is None or self.last_at is None or self.count < 2 or self.last_at <= self.first_at:
            return 0.0
        return (self.count - 1) / (self.last_at - self.first_at)


_STOP = object()  # queued by `Submission.stop`: the stream ends there


def _plain(event: GenerationEvent) -> bool:
    """Text alone (no logprobs entry of its own, not the last event): a later event may take it in."""
    return event.logprobs is None and event.finish_reason is None and event.error is None


# Requests generating in this process (their `Submission.events` has had its first event), and how that
# paces their streams: a stream passes on text at most every 8 ms, and with N at once at most every N ms (at
# most every 50 ms), so the event loop writes at most about a thousand chunks a second in all. Each chunk
# costs the loop the same, one token or ten (a task switch, the protocol's JSON, Django's and daphne's
# write), and the client as much to read: a lone stream on a fast device (a token every 1-3 ms) gets a few
# tokens a chunk, 125 chunks a second at most, which reads as smoothly; its first text goes at once. Measured
# on a 2-core CPU with one BLAS thread, one stream of 512 tokens: the loop's CPU a token 239-273 us -> 127-161,
# the client's 75-81 -> 23-29, decode 415-585 -> 527-600 tok/s (bench/RESULTS.md, 2026-12-07).
PACE_MIN_S = 0.008
PACE_PER_STREAM_S = 0.001
PACE_MAX_S = 0.05
_reading = 0
_reading_lock = threading.Lock()  # tests read streams on more than one loop thread


def pace() -> float:
    """The least time between two text events of one stream now."""
    return min(PACE_MAX_S, max(PACE_MIN_S, PACE_PER_STREAM_S * _reading))


def _count_reader(delta: int) -> None:
    global _reading
    with _reading_lock:
        _reading += delta


class Submission:
    """A queued request: iterate `events()`; `abort()` stops it within a
    step, `stop()` too but ends the stream as a finished one."""

    def __init__(self, generation: Generation):
        self._gen = generation
        self._generated = 0  # tokens the stream has passed on

    async def events(self) -> EventStream:
        """The generation's events. Text events already queued behind the one
        just taken are passed on with it as one (their text and tokens joined):
        a reader that falls behind the engine catches up in one write instead
        of one per token. Text is passed on at most every `pace()` seconds, so
        on a fast device, and more with many requests generating at once,
        each chunk carries a few tokens; the first text goes at once."""
        queue, held = self._gen.events, None
        loop = asyncio.get_running_loop()
        last: float | None = None  # when it last passed on text that a later event could have joined
        counted = False  # in `_reading`: from its first event (a request still queued paces nobody)
        try:
            while True:
                if held is not None:
                    event, held = held, None
                else:
                    event = await queue.get()
                    if last is not None and event is not _STOP and _plain(event):
                        # Text came sooner than the pace allows: wait out the rest and take what came
                        # meanwhile with it. Text that comes later goes at once, with no timer.
                        wait = last + pace() - loop.time()
                        if wait > 0:
                            await asyncio.sleep(wait)
                if not counted:
                    _count_reader(1)
                    counted = True
                while event is not _STOP and _plain(event) and not queue.empty():
                    later = queue.get_nowait()
                    if later is _STOP or later.logprobs is not None or later.error is not None:
                        held = later  # passed on by itself, next
                        break
                    event = dataclasses.replace(later, text=event.text + later.text,
                                                token_ids=event.token_ids + later.token_ids)
                if event is _STOP:
                    yield self._stopped()
                    return
                self._generated += len(event.token_ids)
                last = loop.time() if _plain(event) else None
                yield event
                if event.finish_reason is not None or event.error is not None:
                    return
        finally:
            if counted:
                _count_reader(-1)
            self.abort()  # a consumer that leaves early (disconnect) stops the work

    def abort(self) -> None:
        self._gen.aborted.set()

    @property
    def cached(self) -> int | None:
        """Prompt tokens served from the prompt cache; None until the request is admitted."""
        return self._gen.cached

    def stop(self) -> None:
        """Stop generating (within a decode step) and end the stream with a
        last event as if the model had stopped there: finish reason `stop`,
        usage so far. Events already queued are passed on first; ones the
        engine thread sends after this are not. Once the stream has ended
        this does nothing."""
        if not self._gen.aborted.is_set():
            self._gen.aborted.set()
            self._gen.events.put_nowait(_STOP)

    def _stopped(self) -> GenerationEvent:
        gen = self._gen
        usage = Usage(len(gen.request.prompt_tokens), self._generated, gen.cached or 0, gen.lane)
        return GenerationEvent(finish_reason="stop", usage=usage)
