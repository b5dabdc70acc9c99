"""Grammar-constrained decoding with xgrammar.

`GrammarCompiler` turns a constraint (JSON schema, EBNF, regex, choice,
structural tag) into a compiled grammar, caching by source. `GrammarState`
is one request's matcher: a logits processor that masks every token the
grammar forbids, after the other processors, and notes when the grammar is
complete.

xgrammar (and the torch it imports) loads on first use only.
"""
from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from core.workers import WorkerPool
from inference.engine.errors import EngineError

if TYPE_CHECKING:
    import xgrammar as xgr


class GrammarCompileError(ValueError):
    """The constraint could not be compiled; callers degrade, never fail."""


class GrammarTimeout(EngineError):
    """The constraint did not compile within its time budget, and its compile
    was stopped; callers fail the request (the grammar cannot be enforced,
    and dropping it silently would break the client's parser)."""

    status = 400
    type = "invalid_request_error"
    code = "grammar_timeout"


MAX_WHITESPACE = 16  # the longest run of whitespace constrained JSON may hold, tool arguments included
ANY_OBJECT = '{"type": "object"}'


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # "json" (any object), "json_schema", "ebnf", "regex", "choice", "structural_tag"
    source: str = ""  # schema JSON, grammar text, regex, choices as a JSON list, or a structural tag's JSON
    # Compact JSON: one space after `:` and `,`, none elsewhere. With any_whitespace, a run of whitespace
    # is still at most MAX_WHITESPACE long (a model may indent, never pad to its token limit).
    any_whitespace: bool = False
    strict: bool = True


class GrammarStopped(GrammarTimeout):
    """The server is stopping: compiles in progress were stopped with it."""

    status = 503
    type = "engine_unavailable"
    code = "server_stopping"


class GrammarBusy(EngineError):
    """Too many large grammars are waiting to compile; retry later."""

    status = 429
    type = "resource_admission"
    code = "grammar_compiler_busy"


SMALL_SOURCE = 4096  # specs up to this many characters compile on their own workers, never behind big ones
WORKERS = (2, 1)  # compile processes for short and for long specs
MAX_PENDING = (8, 4)  # short and long compiles running or queued; beyond, new ones are refused
FAILED_KEPT = 256  # specs that did not compile, remembered so a retry is not another compile
TIMEOUT_KEPT_S = 60.0  # a spec that ran out of time is refused at once for this long (load may have caused it)


class GrammarCompiler:
    """Compiles specs for one tokenizer, keeping compiled grammars in a
    byte-capped LRU.

    `submit` answers a future at once: done for a cached spec, shared by
    every request waiting for the same spec. xgrammar cannot stop a compile
    it has begun, and a small spec can take minutes to compile, so compiles
    run in processes of their own (`grammar_worker`, in two
    `core.workers.WorkerPool`s, started at the first compile): two for short
    specs and one for long ones, so a trivial schema never waits behind a
    huge `guided_choice`. A compile has a time budget counted from its
    submission (queueing included); past it, its process is killed, the
    future fails with `GrammarTimeout` and the spec is refused at once for
    a minute. Both queues are bounded: at most MAX_PENDING running or
    queued, refused with `GrammarBusy` beyond, and a spec that failed is
    remembered (so asking again costs nothing). The compiled grammar comes
    back serialized and is rebuilt here against this process's tokenizer
    description."""

    def __init__(self, hf_tokenizer, vocab_size: int, stop_ids: list[int], cache_bytes: int = 256 << 20,
                 timeout_s: float = 10.0):
        self._args = (hf_tokenizer, vocab_size, stop_ids)
        self._info: xgr.TokenizerInfo | None = None
        self._workers: tuple[WorkerPool, ...] = ()
        self._cache: OrderedDict[GrammarSpec, tuple[object, int]] = OrderedDict()
        self._inflight: dict[GrammarSpec, Future] = {}
        self._failed: OrderedDict[GrammarSpec, tuple[Exception, float]] = OrderedDict()  # error, until when
        self._lock = threading.Lock()  # the cache, the in-flight map and the counters; never held over a compile
        self._setup_lock = threading.Lock()
        self._pools = tuple(ThreadPoolExecutor(n, thread_name_prefix="hearth-grammar") for n in WORKERS)
        self.cache_bytes = cache_bytes
        self.timeout_s = timeout_s
        self.vocab_size = vocab_size
        self.stop_ids = stop_ids
        self.hits = self.misses = self.failures = self.refused = self.timeouts = 0
        self._bytes = 0
        self._pending = [0, 0]  # short, long
        self._closed = False

    def _setup(self) -> tuple[xgr.TokenizerInfo, tuple[WorkerPool, ...]]:
        import xgrammar as xgr

        with self._setup_lock:
            if self._info is None:
                tokenizer, vocab_size, stop_ids = self._args
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
                hello = (info.serialize_json() + "\n").encode()
                argv = [sys.executable, "-m", "inference.engine.grammar_worker"]
                self._workers = tuple(WorkerPool(argv, n, hello=hello, warm=False) for n in WORKERS)
                self._info = info
            return self._info, self._workers

    def submit(self, spec: GrammarSpec, timeout_s: float | None = None) -> Future:
        """The compile of `spec` (shared with any other caller of the same
        spec); a new compile gets `timeout_s` (default `self.timeout_s`)."""
        with self._lock:
            if spec in self._cache:
                self._cache.move_to_end(spec)
                self.hits += 1
                done: Future = Future()
                done.set_result(self._cache[spec][0])
                return done
            if spec in self._inflight:
                return self._inflight[spec]
            if spec in self._failed:
                error, until = self._failed[spec]
                if time.monotonic() < until:
                    self.hits += 1
                    failed: Future = Future()
                    failed.set_exception(error)
                    return failed
                del self._failed[spec]
            big = int(len(spec.source) > SMALL_SOURCE)
            if self._pending[big] >= MAX_PENDING[big]:
                self.refused += 1
                raise GrammarBusy(f"{MAX_PENDING[big]} {'long' if big else 'short'} grammars are already compiling; "
                                  "retry shortly")
            self.misses += 1
            self._pending[big] += 1
            budget = self.timeout_s if timeout_s is None else timeout_s
            future = self._pools[big].submit(self._run, spec, big, budget, time.monotonic())
            self._inflight[spec] = future
            return future

    def compile(self, spec: GrammarSpec, timeout: float | None = None):
        """`submit(spec, timeout).result()`, for callers off the event loop."""
        return self.submit(spec, timeout).result()

    def _run(self, spec: GrammarSpec, big: int, budget: float, queued: float):
        began = time.monotonic()
        import xgrammar as xgr

        try:
            info, workers = self._setup()  # xgrammar's import, once per process: not charged to the budget
            answer = workers[big].run(asdict(spec), budget, queued=queued + time.monotonic() - began)
        except Exception as exc:  # the tokenizer description failed: nothing can compile
            answer = {"error": clean_reason(exc)}
        if answer is None and self._closed:
            self._remember_failure(spec, big, GrammarStopped("the server is stopping"), math.inf)
            raise GrammarStopped("the server is stopping; retry on another server or once it is back")
        if answer is None:
            error: Exception = GrammarTimeout(
                "the grammar did not compile within %g s (--grammar-timeout); its compile was stopped. Simplify it, "
                "or ask the operator for a longer budget" % budget)
            self._remember_failure(spec, big, error, time.monotonic() + TIMEOUT_KEPT_S, timeout=True)
            raise error
        if "error" in answer:
            failure = GrammarCompileError(answer["error"])
            self._remember_failure(spec, big, failure, math.inf)
            raise failure
        compiled = xgr.CompiledGrammar.deserialize_json(answer["grammar"], info)
        size = int(getattr(compiled, "memory_size_bytes", 0) or 0) + len(spec.source)
        with self._lock:
            self._inflight.pop(spec, None)
            self._pending[big] -= 1
            if size <= self.cache_bytes:
                self._cache[spec] = (compiled, size)
                self._bytes += size
                while self._bytes > self.cache_bytes:
                    _, (_, dropped) = self._cache.popitem(last=False)
                    self._bytes -= dropped
        return compiled

    def _remember_failure(self, spec: GrammarSpec, big: int, error: Exception, until: float,
                          timeout: bool = False) -> None:
        with self._lock:
            self._inflight.pop(spec, None)
            self._pending[big] -= 1
            self.failures += 1
            self.timeouts += timeout
            self._failed[spec] = (error, until)
            while len(self._failed) > FAILED_KEPT:
                self._failed.popitem(last=False)

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._cache), "bytes": self._bytes, "max_bytes": self.cache_bytes,
                    "hits": self.hits, "misses": self.misses, "failures": self.failures,
                    "compiling": len(self._inflight), "refused_busy": self.refused, "timeouts": self.timeouts,
                    "timeout_s": self.timeout_s, "workers": sum(p.alive() for p in self._workers)}

    def close(self) -> None:
        """Stop every compile now (their futures fail) and the compile processes; never waits on one."""
        self._closed = True
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)
        for workers in self._workers:
            workers.close()

    def state(self, compiled) -> GrammarState:
        return GrammarState(compiled, self.vocab_size, self.stop_ids)


def compile_spec(compiler: xgr.GrammarCompiler, spec: GrammarSpec):
    """`spec` compiled by an xgrammar compiler (in a `grammar_worker`)."""
    most = MAX_WHITESPACE if spec.any_whitespace else None
    if spec.kind == "json":  # json_object: any object, laid out as a json_schema's output is
        return compiler.compile_json_schema(ANY_OBJECT, any_whitespace=spec.any_whitespace, strict_mode=False,
                                            max_whitespace_cnt=most)
    if spec.kind == "json_schema":
        return compiler.compile_json_schema(spec.source, any_whitespace=spec.any_whitespace, strict_mode=spec.strict,
                                            max_whitespace_cnt=most)
    if spec.kind == "ebnf":
        return compiler.compile_grammar(spec.source)
    if spec.kind == "regex":
        return compiler.compile_regex(spec.source)
    if spec.kind == "structural_tag":  # tool-call markup with schema-checked arguments
        return compiler.compile_structural_tag(spec.source)
    if spec.kind == "choice":
        choices = json.loads(spec.source)
        return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in choices))
    raise GrammarCompileError(f"unknown constraint kind {spec.kind!r}")


_SOURCE_PREFIX = re.compile(r"^\s*(\[[^\]]*\]\s*)?(\S+\.(cc|cpp|h|hpp|py):\d+:\s*)?")


def clean_reason(exc: BaseException) -> str:
    """xgrammar's message, first line only, without the C++ source location it
    starts with (`[12:00:00] /project/cpp/x.cc:42: ...`)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    reason = _SOURCE_PREFIX.sub("", lines[0]).strip() if lines else ""
    return reason or type(exc).__name__


class GrammarState:
    """One request's matcher, used as the last logits processor. Runs on the
    engine thread. `finished` turns true once the accepted text completes the
    grammar and nothing but a stop token could follow."""

    def __init__(self, compiled, vocab_size: int, stop_ids: list[int]):
        import xgrammar as xgr

        self._compiled = compiled
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._vocab_size = vocab_size
        self._stop_ids = set(stop_ids)
        self._started = False
        self.finished = False
        self.mask_s = 0.0  # spent accepting tokens and filling masks

    def restart(self, generated: list[int]) -> None:
        """Start over with a matcher that has accepted `generated` (a row
        continuing on a fresh lane after a failed step)."""
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(self._compiled)
        for token in generated:
            self._matcher.accept_token(token)
        self._started = False

    def __call__(self, tokens, logits):
        import mlx.core as mx
        from xgrammar.kernels.apply_token_bitmask_mlx import apply_token_bitmask_mlx

        started = time.perf_counter()
        try:
            if self._started:  # the token sampled last step; the first call sees the prompt
                self._matcher.accept_token(int(tokens[-1].item()))
            self._started = True
            if self._matcher.is_terminated():
                self.finished = True
                return logits
            self._matcher.fill_next_token_bitmask(self._bitmask)
            mask = mx.array(self._bitmask.numpy())
            if self._matcher.is_completed() and self._only_stop_allowed():
                self.finished = True
            return apply_token_bitmask_mlx(mask, logits, self._vocab_size)
        finally:
            self.mask_s += time.perf_counter() - started

    def forced(self, last: int, tokenizer, most: int) -> list[int]:
        """Jump-forward: the tokens of the text the grammar allows next and
        nothing else (xgrammar's jump-forward string: `{"name": "` after `{`
        in a schema with one required key), at most `most`, accepted by the
        matcher; [] when the next text is free. The token sampled last is
        accepted first if it has not been yet, so the caller's next call of
        this processor masks the position after the forced tokens.

        The string is tokenized on its own, so a span may be split where the
        model would have split it otherwise (as SGLang's jump-forward does);
        a token the matcher refuses (a tokenizer that adds a prefix space,
        say) ends the span there."""
        started = time.perf_counter()
        try:
            return self._forced(last, tokenizer, most)
        finally:
            self.mask_s += time.perf_counter() - started

    def _forced(self, last: int, tokenizer, most: int) -> list[int]:
        if self._started:  # the token sampled last: accepted now, not by the next call
            self._matcher.accept_token(last)
            self._started = False
        if most <= 0 or self._matcher.is_terminated():
            return []
        text = self._matcher.find_jump_forward_string()
        if not text:
            return []
        tokens = tokenizer.encode(text, add_special_tokens=False)[:most]
        accepted: list[int] = []
        for token in tokens:
            if token in self._stop_ids or not self._matcher.accept_token(token):
                break
            accepted.append(token)
        return accepted

    def _only_stop_allowed(self) -> bool:
        import numpy as np

        bits = np.unpackbits(self._bitmask.numpy().view(np.uint8), bitorder="little")[: self._vocab_size]
        return set(np.flatnonzero(bits).tolist()) <= self._stop_ids
