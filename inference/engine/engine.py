"""The engine: a single thread that owns the model and every MLX call.

Callers on the asyncio loop submit a `GenerationRequest` and iterate its
`GenerationEvent`s; events cross back with `loop.call_soon_threadsafe`.
Requests run one at a time, in arrival order; an aborted request (a client
that went away) stops within one decode step.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from inference.engine import loader
from inference.engine.errors import EngineClosed, EngineError, QueueFull
from inference.engine.textstream import StopMatcher
from inference.engine.types import GenerationEvent, GenerationRequest, Usage

log = logging.getLogger("hearth.engine")

MAX_QUEUED = 64


@dataclass
class _Job:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    aborted: threading.Event = field(default_factory=threading.Event)

    def emit(self, event: GenerationEvent) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is gone; nobody is listening
            self.aborted.set()


@dataclass
class EngineStats:
    requests_total: int = 0
    requests_active: int = 0
    prompt_tokens_total: int = 0
    generated_tokens_total: int = 0
    last_decode_tps: float = 0.0


class Submission:
    """A queued request: iterate `events()`; `abort()` stops it within a step."""

    def __init__(self, job: _Job):
        self._job = job

    async def events(self) -> AsyncIterator[GenerationEvent]:
        try:
            while True:
                event = await self._job.events.get()
                yield event
                if event.finish_reason is not None or event.error is not None:
                    return
        finally:
            self.abort()  # a consumer that leaves early (disconnect) stops the work

    def abort(self) -> None:
        self._job.aborted.set()


class Engine:
    def __init__(self, model_ref: str, keep_dtype: bool = False):
        self.model_ref = model_ref
        self.keep_dtype = keep_dtype
        self.loaded: loader.LoadedModel | None = None
        self.stats = EngineStats()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._closed = False
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hearth-engine", daemon=True)
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._active: _Job | None = None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> loader.LoadedModel:
        """Start the thread and load the model on it; raises what loading raised."""
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        assert self.loaded is not None
        return self.loaded

    def close(self, drain_seconds: float = 30.0) -> None:
        """Refuse new work, let running and queued requests finish for up to
        `drain_seconds`, abort what is left, and stop the thread."""
        self._closed = True
        deadline = time.monotonic() + drain_seconds
        with self._idle:
            while self.busy and time.monotonic() < deadline:
                self._idle.wait(0.05)
        self._abort_all()
        active = self._active
        if active is not None:
            active.aborted.set()
            active.emit(GenerationEvent(error="server is shutting down"))
        self._jobs.put(None)
        self._thread.join(timeout=5)

    # -- asyncio side ----------------------------------------------------
    def submit(self, request: GenerationRequest) -> "Submission":
        """Queue `request`; raises `EngineClosed` or `QueueFull` at once, so
        the caller can still answer with an HTTP error."""
        if self._closed:
            raise EngineClosed("server is shutting down")
        if self.queued >= MAX_QUEUED:
            raise QueueFull(f"generation queue is full ({MAX_QUEUED} requests waiting)")
        job = _Job(request, asyncio.get_running_loop(), asyncio.Queue())
        self.stats.requests_total += 1
        self._jobs.put(job)
        return Submission(job)

    @property
    def queued(self) -> int:
        """Requests waiting for the engine thread. Read from the queue itself:
        a counter shared by two threads would drift."""
        return self._jobs.qsize()

    @property
    def busy(self) -> bool:
        return bool(self.stats.requests_active or self.queued)

    # -- engine thread ---------------------------------------------------
    def _run(self) -> None:
        try:
            self.loaded = loader.load(self.model_ref, keep_dtype=self.keep_dtype)
        except BaseException as exc:  # reported to start(), which re-raises
            self._load_error = exc
            self._ready.set()
            return
        self._ready.set()
        while (job := self._jobs.get()) is not None:
            if not job.aborted.is_set():
                self.stats.requests_active += 1
                self._active = job
                try:
                    self._generate(job)
                except Exception as exc:
                    log.exception("generation %s failed", job.request.id)
                    job.emit(GenerationEvent(error=str(exc) or type(exc).__name__))
                finally:
                    self._active = None
                    self.stats.requests_active -= 1
            with self._idle:
                self._idle.notify_all()

    def _abort_all(self) -> None:
        pending = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.aborted.set()
                job.emit(GenerationEvent(error="server is shutting down"))
                pending.append(job)
        for job in pending:  # the thread still takes them off, and skips them
            self._jobs.put(job)

    def _generate(self, job: _Job) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        req, model = job.request, self.loaded
        assert model is not None
        s, lp = req.sampling, req.logits
        tokenizer = model.tokenizer
        eos = set(tokenizer.eos_token_ids)
        if s.seed is not None:
            # Requests run one at a time, so seeding here makes the stream request-local.
            mx.random.seed(s.seed)
        sampler = make_sampler(s.temperature, s.top_p, s.min_p, 1, top_k=s.top_k,
                               xtc_probability=s.xtc_probability, xtc_threshold=s.xtc_threshold,
                               xtc_special_tokens=model.newline_ids + sorted(eos))
        processors = make_logits_processors(
            lp.logit_bias, lp.repetition_penalty, lp.repetition_context_size, lp.presence_penalty,
            lp.presence_context_size, lp.frequency_penalty, lp.frequency_context_size)  # [] when none is set
        if req.grammar is not None:
            processors.append(req.grammar)  # masks after the other processors
        limit = self._token_limit(req)
        detok = tokenizer.detokenizer
        detok.reset()
        stops = StopMatcher(req.stop)
        self.stats.prompt_tokens_total += len(req.prompt_tokens)

        count, finish, started = 0, "length", None
        steps = generate_step(mx.array(req.prompt_tokens), model.model, max_tokens=limit,
                              sampler=sampler, logits_processors=processors or None)
        want_logprobs = req.logprobs or req.top_logprobs > 0
        for token, logprobs in steps:
            if job.aborted.is_set():
                break
            started = started or time.perf_counter()
            count += 1
            self.stats.generated_tokens_total += 1
            if token in eos:  # counted, never shown
                finish = "stop"
                break

            detok.add_token(token)
            entry = _logprob_entry(tokenizer, token, logprobs, req.top_logprobs) if want_logprobs else None
            job.emit(GenerationEvent(text=stops.feed(detok.last_segment), token_ids=(token,), logprobs=entry))
            if stops.stopped or (req.grammar is not None and req.grammar.finished):
                finish = "stop"  # a stop string matched, or the grammar is complete
                break
        if started and count > 1:
            self.stats.last_decode_tps = (count - 1) / (time.perf_counter() - started)
        if job.aborted.is_set():
            return
        detok.finalize()
        tail = stops.feed(detok.last_segment)  # nothing once a stop string matched
        if stops.stopped:
            finish = "stop"
        else:
            tail += stops.flush()
        usage = Usage(len(req.prompt_tokens), count)
        job.emit(GenerationEvent(text=tail, finish_reason=finish, usage=usage))

    def _token_limit(self, req: GenerationRequest) -> int:
        """The request's cap, bounded by the room left in the context window."""
        window = self.loaded.context_window if self.loaded else None
        room = max(window - len(req.prompt_tokens), 1) if window else None
        caps = [c for c in (req.max_tokens, room) if c is not None]
        return min(caps) if caps else -1


def _logprob_entry(tokenizer, token: int, logprobs, top: int) -> dict:
    """mlx_lm.server's logprobs entry: with top-k, the most likely token merged
    with the sorted top-k list; otherwise the chosen token's id and logprob."""
    import mlx.core as mx

    if top <= 0:
        return {"id": token, "logprob": logprobs[token].item()}
    ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
    values = logprobs[ids]
    order = mx.argsort(-values)
    ids, values = ids[order].tolist(), values[order].tolist()
    pieces = tokenizer.convert_ids_to_tokens(ids)
    ranked = [{"id": i, "token": p, "logprob": v} for i, p, v in zip(ids, pieces, values, strict=True)]
    return dict(ranked[0], top_logprobs=ranked)


__all__ = ["Engine", "EngineError"]
