"""The engine: a single thread that owns the model and every MLX call.

Callers on the asyncio loop submit a `GenerationRequest` and iterate its
`GenerationEvent`s; events cross back in a `rows.Mailbox`, which wakes the
loop only for a reader that waits.

Which waiting request starts next, and when, is `admission.py`'s: the
queue's bound, the context checks a prompt meets before any prefill, the KV
budget the running rows must fit in, and the adapter set they share.

Each admitted request first takes the longest prefix it shares with an
earlier one from the prompt cache; whatever it leaves in its KV cache when
it ends goes back there. An aborted request (a client that went away) stops
within one decode step (on the serial lane, once a prefill in progress
ends) and leaves the other rows untouched; one still waiting gives up its
queue place at once.

Work that needs the model to itself (`exclusive`, the Curve Designer's)
pauses admission, waits for the running rows to end and runs alone on the
engine thread; `solo.py` says how.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.engine import admission, checks, lanes, loader, metrics, speculate
from inference.engine.adapters import AdapterManager
from inference.engine.admission import Admission
from inference.engine.errors import EngineClosed, EngineError, EngineTimeout
from inference.engine.prompt_cache import PromptCache
from inference.engine.rows import Generation, Row, Submission, gathered
from inference.engine.solo import Solo, SoloQueue
from inference.engine.types import GenerationEvent, GenerationRequest

if TYPE_CHECKING:
    from inference.engine.ssd_cache import SSDCache

log = logging.getLogger("hearth.engine")

# `--batch auto`: the most rows decoding together. On a CPU a step's GEMMs
# get faster per row up to well past 32 rows (BLAS efficiency grows with M),
# so a bigger batch only costs memory, which admission checks.
AUTO_BATCH_MAX = 64
PREFILL_ROWS = 8  # prompts prefilled together in one step at least (mlx-lm's server: 8), more if short
# Drafts per round: a wrong guess costs a wider forward, and prompt lookup's
# guesses come in runs (it copies), a draft model's one at a time.
DRAFT_TOKENS = {"ngram": 8, "model": 3}


@dataclass(frozen=True)
class EngineConfig:
    batch: int | None = None  # most rows decoding together; None = auto (memory permitting); 1 = serial
    prefill_chunk: int = 256  # prompt tokens prefilled per step while other rows decode
    max_context: int | None = None  # operator cap on prompt + generation tokens
    memory_budget: int | None = None  # operator cap on weights + KV bytes
    kv_budget: int | None = None  # operator cap on the running rows' KV bytes together
    prompt_cache_bytes: int = 1 << 30  # 0 turns the prompt cache off
    ssd_cache: str | None = None  # directory of the SSD tier
    ssd_cache_bytes: int = 16 << 30
    ssd_queue_bytes: int = 1 << 30  # write-behind bound; beyond it a snapshot waits for a flush
    kv_quant: int | None = None  # 4 or 8: quantized KV cache (serial lane)
    keep_dtype: bool = False
    draft_kind: str | None = None  # "ngram" (prompt lookup) or "model" (draft_model); None: no speculation
    draft_model: str | None = None  # a small model with the served model's tokenizer
    draft_tokens: int | None = None  # most drafts per round; None: DRAFT_TOKENS[kind]
    jump_forward: bool = True  # a lone request under a grammar appends what the grammar forces unsampled


@dataclass
class EngineStats:
    requests_total: int = 0
    submitted_rows: int = 0
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    generated_tokens_total: int = 0
    last_decode_tps: float = 0.0
    failed_rows: int = 0  # rows ended by their own failure; their neighbours went on
    failed_steps: int = 0  # batched steps that failed as a whole (see _recover)
    peak_rows: int = 0  # the most rows that ran together


class _Call:
    def __init__(self, fn: Callable):
        self.fn, self.done = fn, threading.Event()
        self.result: Any = None
        self.error: Exception | None = None


class Engine:
    def __init__(self, model_ref: str, config: EngineConfig | None = None):
        self.model_ref = model_ref
        self.config = config or EngineConfig()
        self.loaded: loader.LoadedModel | None = None
        self.stats = EngineStats()
        self.cache: PromptCache | None = None
        self.ssd: SSDCache | None = None
        self.lane: speculate.AnyLane | None = None
        self.adapters: AdapterManager | None = None
        self.mode = "off"  # "off" | "serial" | "batch", as /stats reports it
        self.serial_reason: str | None = None
        self.draft: loader.LoadedModel | None = None  # the draft model, with --draft-model
        self.spec_totals = speculate.SpecTotals()
        self.spec_off: str | None = None  # why a configured draft source is not used
        self._inbox: queue.Queue = queue.Queue()
        self._admission = Admission()  # the requests waiting for a row
        self._solo = SoloQueue()  # calls that wait for exclusive use of the model
        self._closed = False
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hearth-engine", daemon=True)
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._missing_seen = 0  # SSD snapshots lost before the previous flush

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
        `drain_seconds`, fail what is left, and stop the thread."""
        self._closed = True
        deadline = time.monotonic() + drain_seconds
        with self._idle:
            while self.busy and time.monotonic() < deadline:
                self._idle.wait(0.05)
        self._inbox.put(None)
        self._thread.join(timeout=10)
        self.stop_grammar_compiles()

    def stop_grammar_compiles(self) -> None:
        """Kill the grammar compiles in progress (their requests fail at once)
        and the compile processes: a stopping server never waits on one."""
        if self.loaded is not None and "grammar_compiler" in vars(self.loaded):
            self.loaded.grammar_compiler.close()

    # -- asyncio side ----------------------------------------------------
    def check_room(self, n: int) -> None:
        """Raise `ContextLengthExceeded` or `ContextOverBudget` for a prompt
        of `n` tokens that leaves no room to generate, as `submit` does."""
        self._admission.check_room(n, self.loaded.context_window if self.loaded is not None else None)

    def submit(self, request: GenerationRequest) -> Submission:
        """Queue `request`; raises `EngineClosed`, `QueueFull`,
        `ContextLengthExceeded` or `ContextOverBudget` at once, so the caller
        can still answer with an HTTP error."""
        if self._closed:
            raise EngineClosed("server is shutting down")
        if self.loaded is not None:
            checks.check(request, self.loaded.vocab_size, self.loaded.context_window)
        self.check_room(len(request.prompt_tokens))
        self._admission.reserve(lambda: self._closed)
        gen = Generation(request, asyncio.get_running_loop())
        self.stats.requests_total += 1
        self._inbox.put(gen)
        return Submission(gen)

    def call(self, fn: Callable, timeout: float = 60.0):
        """Run `fn()` on the engine thread between decode steps (inline once
        the thread has stopped) and return its result."""
        if not self._thread.is_alive():
            return fn()
        call = _Call(fn)
        self._inbox.put(call)
        if not call.done.wait(timeout):
            raise EngineTimeout("the engine did not answer in time")
        if call.error is not None:
            raise call.error
        return call.result

    def exclusive(self, fn: Callable[[], Any]) -> Future:
        """Run `fn()` on the engine thread with the model to itself: no
        request decodes beside it or between its steps (see solo.py). Answers
        a Future of its result; cancel it to give up while it still waits.
        Raises `EngineClosed`, or `QueueFull` when too many calls wait."""
        if self._closed:
            raise EngineClosed("server is shutting down")
        item = self._solo.offer(fn)
        self._inbox.put(item)
        return item.future

    @property
    def queued(self) -> int:
        """Requests admitted to the queue but not yet running."""
        return self._admission.queued

    @property
    def active_rows(self) -> int:
        return self.lane.active if self.lane is not None else 0

    @property
    def pending_rows(self) -> int:
        return self.queued + (self.lane.prefilling if self.lane is not None else 0)

    @property
    def capacity(self) -> int:
        """The most rows that may run at once (memory may hold admission below it)."""
        return self._admission.row_ceiling

    @property
    def kv_room(self) -> int:
        """Bytes the running rows' KV may take; 0 = unchecked."""
        return self._admission.kv_room

    @property
    def held_for_memory(self) -> int:
        """Requests that waited because their KV would not fit yet."""
        return self._admission.held_for_memory

    @property
    def enforced_context(self) -> int | None:
        """The operator's cap on prompt + generation tokens, once set up (see admission.py)."""
        return self._admission.enforced_context

    @property
    def context_limit(self) -> int | None:
        """The tokens one request may hold, prompt and reply: the model's window, or the operator's cap
        (`enforced_context`: --max-context, the memory budget) where that is smaller; None: neither is known."""
        window = self.loaded.context_window if self.loaded is not None else None
        caps = [c for c in (window, self.enforced_context) if c]
        return min(caps) if caps else None

    @property
    def kv_bytes(self) -> int:
        """Projected KV bytes of the running rows at their token limits."""
        if self.lane is None or self.loaded is None:
            return 0
        window = self.loaded.context_window or 1 << 30
        per_token = self.loaded.kv_bytes_per_token
        return sum(min(len(r.req.prompt_tokens) + r.limit, window) * per_token for r in self.lane.all_rows())

    @property
    def busy(self) -> bool:
        return bool(self.active_rows or self.queued or self._solo.pending)

    # -- engine thread ---------------------------------------------------
    # The model, lane, adapters and prompt cache exist once _setup has run,
    # before any work reaches the thread; these read them, typed as present.
    @property
    def loaded_model(self) -> loader.LoadedModel:
        """`loaded`, for callers that hold a started engine (any thread)."""
        if self.loaded is None:
            raise EngineError("the model is not loaded")
        return self.loaded

    @property
    def _lane(self) -> speculate.AnyLane:
        if self.lane is None:
            raise EngineError("the engine is not set up")
        return self.lane

    @property
    def _adapters(self) -> AdapterManager:
        if self.adapters is None:
            raise EngineError("the engine is not set up")
        return self.adapters

    @property
    def _cache(self) -> PromptCache:
        if self.cache is None:
            raise EngineError("the engine is not set up")
        return self.cache

    def _run(self) -> None:
        """The engine thread. All its MLX work runs on one stream, mlx-lm's generation stream (the one
        `BatchGenerator` decodes on): MLX's CPU backend runs each stream on a worker thread of its own, and
        each worker that calls a threaded BLAS (Intel MKL's OpenMP) gets its own pool of BLAS threads. Two
        pools on the same cores put OpenMP in its oversubscribed mode (yielding waits) for the life of the
        process: measured on 2 cores with MKL, a 32-row batch of a 12 x 1024 llama decoded at 3,550 tok/s
        until a second stream had run matmuls once, and at 1,190 after.

        On the way out the thread clears its MLX streams, as MLX asks of every thread that used them: left to
        the process's static destructors they aborted a process that had run an engine (`terminate called
        without an active exception`, 7 runs in 10 with OpenBLAS preloaded), after its work was done."""
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        try:
            with mx.stream(generation_stream):
                self._serve()
        finally:
            mx.clear_streams()

    def _serve(self) -> None:
        try:
            self.loaded = loader.load(self.model_ref, keep_dtype=self.config.keep_dtype)
            self._setup()
        except BaseException as exc:  # reported to start(), which re-raises
            self._load_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while self._take_inbox(block=not (self.active_rows or self._admission.waiting or self._solo)):
                self._solo.sweep()
                self._admission.sweep()
                if self._solo.holds_admission(bool(self._admission.waiting)):
                    if not self.active_rows:  # the lane has drained: the call runs alone
                        self._solo.run_next(self._default_adapters)
                else:
                    self._admission.admit(self._lane, self.loaded_model, self._adapters, self._admitted)
                    self._solo.just_ran = False
                if self.active_rows:
                    with gathered():  # one wake-up of each loop, for its waiting readers
                        self._step()
                with self._idle:
                    self._idle.notify_all()
        except BaseException:
            log.exception("engine thread failed; refusing new work")
            raise
        finally:
            self._closed = True  # whatever stopped the loop, nothing is left waiting for an answer
            self._shutdown()

    def _setup(self) -> None:
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

        cfg, model = self.config, self.loaded_model
        sample = make_prompt_cache(model.model)
        if cfg.batch == 1:
            self.mode = "off"
        elif cfg.kv_quant:
            self.mode, self.serial_reason = "serial", "quantized KV caches cannot be merged into a batch"
        elif not all(hasattr(c, "merge") for c in sample):
            self.mode, self.serial_reason = "serial", "this model's cache type cannot be batched"
        else:
            self.mode = "batch"
        lane: speculate.AnyLane
        self._admission.row_ceiling = (cfg.batch or AUTO_BATCH_MAX) if self.mode == "batch" else 1
        self._setup_speculation(can_trim_prompt_cache(sample))
        self.lane = lane = self._new_lane()
        if cfg.kv_budget is not None and cfg.kv_budget < (model.kv_bytes_per_token or 1):
            raise EngineError(f"--kv-budget {cfg.kv_budget} holds no token of this model's KV cache "
                              f"({model.kv_bytes_per_token} bytes a token)")
        room = admission.kv_room(cfg.memory_budget, cfg.prompt_cache_bytes, model, self.draft)
        self._admission.kv_room = min(room or cfg.kv_budget, cfg.kv_budget) if cfg.kv_budget else room
        if cfg.ssd_cache:
            from inference.engine.ssd_cache import SSDCache

            self.ssd = SSDCache(Path(cfg.ssd_cache), self._namespace(), cfg.ssd_cache_bytes, cfg.ssd_queue_bytes,
                                source=str(model.path))
        self.cache = PromptCache(cfg.prompt_cache_bytes, self.ssd, trimmable=can_trim_prompt_cache(sample))
        self.adapters = model.adapters
        self._admission.enforced_context = admission.enforced_context(cfg.max_context, cfg.memory_budget, model,
                                                                      cfg.kv_budget)
        log.info("engine: lane %s (up to %d rows%s%s), prompt cache %d MiB%s", lane.name, self.capacity,
                 ", auto" if cfg.batch is None and self.mode == "batch" else "",
                 f"; serial because {self.serial_reason}" if self.serial_reason else "",
                 cfg.prompt_cache_bytes >> 20, f", ssd tier {self.ssd.dir}" if self.ssd else "")

    def _new_lane(self) -> speculate.AnyLane:
        lane: lanes.Lane
        if self.mode == "batch":
            lane = lanes.BatchLane(self.loaded_model, self.capacity, self.config.prefill_chunk,
                                   min(self.capacity, PREFILL_ROWS))
        else:
            lane = lanes.SerialLane(self.loaded_model, self.config.kv_quant, self._kv_group())
        kind = self.speculation
        if kind is None and not self.jump_forward and self.mode != "batch":  # a batch lane's lone row: plain steps
            return lane
        drafter: speculate.Drafter | None = None
        k = self.config.draft_tokens or DRAFT_TOKENS.get(kind or "", 0)
        if kind == "model":
            assert self.draft is not None
            drafter = speculate.ModelDrafter(self.draft, k)
        elif kind == "ngram":
            drafter = speculate.NgramDrafter(k)
        return speculate.Speculating(lane, self.loaded_model, drafter, self.spec_totals, self.jump_forward)

    @property
    def jump_forward(self) -> bool:
        """Whether a lone request under a grammar decodes with jump-forward
        (not with a quantized KV cache: its rows keep the serial lane's caches)."""
        return self.config.jump_forward and not self.config.kv_quant

    @property
    def speculation(self) -> str | None:
        """The draft source in use: "ngram", "model" or None."""
        cfg = self.config
        if self.spec_off:
            return None
        return cfg.draft_kind or ("model" if cfg.draft_model else None)

    def _setup_speculation(self, trimmable: bool) -> None:
        """Check the draft source against the served model and load a draft model."""
        kind, cfg = self.speculation, self.config
        if kind is None:
            return
        if kind not in DRAFT_TOKENS:
            raise EngineError(f"unknown draft kind {kind!r}; use ngram or model")
        if kind == "model" and not cfg.draft_model:
            raise EngineError("--draft-kind model needs --draft-model")
        if kind == "ngram" and cfg.draft_model:
            raise EngineError("--draft-model drafts with a model; it cannot go with --draft-kind ngram")
        if cfg.kv_quant:
            raise EngineError("speculative decoding cannot run with --kv-quant (quantized caches are not rewound)")
        if not trimmable:  # a router hands --draft-kind to every model: this one serves without it
            self.spec_off = "this model's KV cache cannot be rewound (recurrent or other non-trimmable layers)"
            log.warning("speculative decoding is off: %s", self.spec_off)
            return
        if kind == "model":
            assert cfg.draft_model is not None
            self.draft = loader.load(cfg.draft_model, keep_dtype=cfg.keep_dtype)
            target, draft = self.loaded_model, self.draft
            probe = "Hearth checks the draft model: 0123 ünïcödé"
            if (draft.tokenizer.eos_token_ids != target.tokenizer.eos_token_ids
                    or draft.tokenizer.encode(probe) != target.tokenizer.encode(probe)
                    or draft.vocab_size > target.vocab_size):
                raise EngineError(f"the draft model {cfg.draft_model} does not share the served model's tokenizer "
                                  "(its end-of-sequence tokens, its splitting of text or its vocabulary differ)")

    def _kv_group(self) -> int:
        """The quantization group for KV rows: MLX quantizes in groups of 32,
        64 or 128 along the head dimension, which must divide it."""
        if not self.config.kv_quant:
            return 64
        head_dim = self.loaded_model.head_dim
        for group in (64, 32):
            if head_dim and head_dim % group == 0:
                return group
        raise EngineError(f"--kv-quant needs a head dimension divisible by 32; this model's is {head_dim}")

    def _namespace(self) -> str:
        """SSD entries are only valid for the same weights, dtype and KV format."""
        m = self.loaded_model
        ident = f"{m.path}|{m.dtype}|kv{self.config.kv_quant or 0}"
        return hashlib.sha1(ident.encode()).hexdigest()[:16]

    def _take_inbox(self, block: bool) -> bool:
        """Move submitted work into the engine; False once asked to stop.
        Takes what the inbox held when it looked, not what comes in while a
        call runs: a caller whose next call follows each answer (the turns of
        an embeddings request) would otherwise run turn after turn with no
        decode step between them whenever its round trip beats this thread
        back to the interpreter lock (a thread tokenizing beside them held a
        stream 35 s)."""
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        more = self._inbox.qsize()
        while True:
            if item is None:
                return False
            if isinstance(item, _Call):
                try:
                    item.result = item.fn()
                except Exception as exc:
                    item.error = exc
                item.done.set()
            elif isinstance(item, Solo):
                self._solo.add(item)
            else:
                self._admission.waiting.append(item)
            if more <= 0:
                return True
            more -= 1
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _admitted(self, row: Row) -> None:
        """Count an admitted row and start it."""
        n = len(row.req.prompt_tokens)
        self.stats.submitted_rows += 1
        self.stats.peak_rows = max(self.stats.peak_rows, self._lane.active + 1)
        self.stats.prompt_tokens_total += n
        metrics.PROMPT_TOKENS.inc(n)
        self._start(row)

    def _default_adapters(self) -> None:
        """Before a solo call: the adapters a request that names none would run with."""
        self._admission.use_group(self._adapters, self._adapters.resolve(None))

    def _start(self, row: Row) -> None:
        """Put a row on the lane from the longest cached prefix of its context
        (an image request's image part prefilled first, when not cached)."""
        tokens = row.context()
        try:
            cache, cached = self._cache.lookup(row.key(tokens), row.req.session, row.ns)
        except Exception:
            log.exception("prompt cache lookup failed; prefilling request %s in full", row.req.id)
            cache, cached = None, 0
        if not row.generated:
            row.cached = row.generation.cached = cached
            if row.generation.admitted is None:
                row.generation.admitted = time.perf_counter()
            self.stats.cached_tokens_total += cached
            metrics.CACHED_TOKENS.inc(cached)
        try:
            vision = self.loaded_model.vision
            if row.req.images and vision is not None and cached < _last_image_end(row, vision.image_token_id):
                cache, cached = vision.prefill(self.loaded_model.model, tokens, row.req.images, cache, cached,
                                               self.config.prefill_chunk)
            self._lane.add(row, cache, cached)
        except Exception as exc:
            log.exception("could not start request %s", row.req.id)
            row.fail(lanes.fault_message(exc))

    def _step(self) -> None:
        lane = self._lane
        try:
            published = lane.step()
        except Exception as exc:
            self._recover(exc)
            return
        self.stats.failed_rows += lane.take_faults()
        for tokens, cache, row in published:
            self.stats.generated_tokens_total += row.count
            if row.decode_tps:
                self.stats.last_decode_tps = row.decode_tps
            if tokens is None or cache is None or not self._adapters.current(row.adapters):
                continue  # nothing, or KV from adapter weights that are gone
            try:
                self._cache.publish(row.key(tokens), cache, row.req.session, row.ns)
            except Exception:
                log.exception("prompt cache: could not keep the cache of request %s", row.req.id)

    def _recover(self, exc: Exception) -> None:
        """A step failed as a whole. The rows whose own sampling fails alone
        are ended with the error and the others go on, on a fresh lane, from
        what they had generated. When no row can be blamed, every row goes on
        once; a second such failure ends the rows it already restarted."""
        rows = self._lane.all_rows()
        self.stats.failed_steps += 1
        suspects = [row for row in rows if lanes.suspect(row, self.loaded_model)]
        ended = suspects or [row for row in rows if row.restarts]
        log.error("decode step failed (%s: %s); ending %d of %d rows", type(exc).__name__, exc, len(ended), len(rows))
        self._reset_lane()
        for row in rows:
            if row.aborted:
                lanes.close_row(row)
            elif row in ended:
                row.fault = row.fault or exc
                lanes.fail_faulty(row)
                self.stats.failed_rows += 1
            else:
                row.restarts += 1
                self._start(row)

    def _reset_lane(self) -> None:
        self.lane = self._new_lane()

    def _shutdown(self) -> None:
        message = "server is shutting down"
        if self.lane is not None:
            self.lane.fail_all(message)
        self._admission.fail_all(message)
        while True:  # work that arrived after the stop marker
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Generation):
                item.emit(GenerationEvent(error=message))
            elif isinstance(item, _Call):
                item.error = EngineClosed(message)
                item.done.set()
            elif isinstance(item, Solo):
                self._solo.add(item)
        self._solo.fail_all(EngineClosed(message))
        self._admission.release_all()
        with self._idle:
            self._idle.notify_all()

    # -- adapters ----------------------------------------------------------
    def mount_adapter(self, adapter_id: str, path: str, make_default: bool = False, timeout: float = 120.0) -> dict:
        """Mount (or replace) a LoRA adapter between forward passes."""
        def mount():
            adapters = self._adapters
            old = adapters.mounted.get(adapter_id)
            result = adapters.mount(adapter_id, path, make_default)  # includes the resolved path
            if old is not None:
                self._cache.forget_adapter(adapters.namespace((old,)))
            return result
        return self.call(mount, timeout)

    def unmount_adapter(self, adapter_id: str) -> dict:
        def unmount():
            adapters = self._adapters
            old = adapters.mounted.get(adapter_id)
            result = adapters.unmount(adapter_id)  # raises AdapterNotMounted
            if old is not None:
                self._cache.forget_adapter(adapters.namespace((old,)))
            return result
        return self.call(unmount)

    # -- cache administration ---------------------------------------------
    def close_session(self, session: str) -> None:
        if self.cache is not None:
            self.cache.close_session(session)

    def flush_cache(self, timeout: float = 120.0) -> tuple[bool, dict]:
        """Write every RAM entry not yet on the SSD tier and wait for the
        writes; (durable, counters) as POST /admin/cache/flush reports them."""
        started = time.perf_counter()
        ssd = self.ssd
        if ssd is None:
            return True, {"durable": True, "flushedSnapshots": 0, "missingSnapshots": 0, "pendingSnapshots": 0,
                          "pendingSpills": 0, "pendingSpillBytes": 0, "droppedSpills": 0, "failedSpills": 0,
                          "elapsedMs": 0, "entries": 0, "longest_durable_prefix_tokens": 0}
        failed_before = ssd.stats()["failed_spills"]

        def enqueue() -> int:
            pending = self._cache.pending_durability()
            for entry in pending:
                ssd.submit(entry, force=True)
            return len(pending)

        flushed = self.call(enqueue, timeout)
        ssd.wait_idle(max(timeout - (time.perf_counter() - started), 0))
        # Judged on the entries themselves: a write the size cap undid is not durable.
        not_durable = self.call(lambda: len(self._cache.pending_durability()), timeout)
        s = ssd.stats()
        failed = s["failed_spills"] - failed_before
        missing = s["missing_snapshots"] - self._missing_seen  # lost since the last flush
        self._missing_seen = s["missing_snapshots"]
        durable = s["pending_snapshots"] == 0 and failed == 0 and missing == 0 and not_durable == 0
        return durable, {
            "durable": durable, "flushedSnapshots": flushed, "missingSnapshots": missing,
            "pendingSnapshots": s["pending_snapshots"], "pendingSpills": s["pending_spills"],
            "pendingSpillBytes": s["pending_spill_bytes"], "droppedSpills": s["dropped_spills"],
            "failedSpills": failed, "notDurableEntries": not_durable,
            "elapsedMs": round((time.perf_counter() - started) * 1000),
            "entries": s["entries"], "longest_durable_prefix_tokens": s["longest_durable_prefix_tokens"],
        }


def _last_image_end(row: Row, image_token_id: int) -> int:
    """Where the prompt's last image run ends: a cache shorter than this
    leaves image tokens that only the vision prefill can embed."""
    prompt = row.req.prompt_tokens
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == image_token_id:
            return i + 1
    return 0


__all__ = ["Engine", "EngineConfig", "EngineError"]
