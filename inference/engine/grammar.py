"""Grammar-constrained decoding with xgrammar.

`GrammarCompiler` turns a constraint (JSON schema, EBNF, regex, choice)
into a compiled grammar, caching by source. `GrammarState` is one request's
matcher: a logits processor that masks every token the grammar forbids,
after the other processors, and notes when the grammar is complete.

xgrammar (and the torch it imports) loads on first use only.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass


class GrammarCompileError(ValueError):
    """The constraint could not be compiled; callers degrade, never fail."""


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # "json", "json_schema", "ebnf", "regex", "choice"
    source: str = ""  # schema JSON, grammar text, regex, or choices as a JSON list
    any_whitespace: bool = True
    strict: bool = True


class GrammarCompiler:
    """Compiles specs for one tokenizer; thread-safe, with an LRU of results."""

    def __init__(self, hf_tokenizer, vocab_size: int, stop_ids: list[int], cache_size: int = 64):
        self._args = (hf_tokenizer, vocab_size, stop_ids)
        self._compiler = None
        self._cache: OrderedDict[GrammarSpec, object] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.vocab_size = vocab_size
        self.stop_ids = stop_ids
        self.hits = 0

    def _xgr(self):
        import xgrammar as xgr

        if self._compiler is None:
            tokenizer, vocab_size, stop_ids = self._args
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
            self._compiler = xgr.GrammarCompiler(info, cache_enabled=True)
        return self._compiler

    def compile(self, spec: GrammarSpec):
        with self._lock:
            if spec in self._cache:
                self._cache.move_to_end(spec)
                self.hits += 1
                return self._cache[spec]
            try:
                compiled = self._compile(self._xgr(), spec)
            except Exception as exc:  # xgrammar raises RuntimeError/ValueError with a reason
                raise GrammarCompileError(str(exc).strip().splitlines()[0] if str(exc).strip() else
                                          type(exc).__name__) from exc
            self._cache[spec] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return compiled

    @staticmethod
    def _compile(compiler, spec: GrammarSpec):
        if spec.kind == "json":
            return compiler.compile_builtin_json_grammar()
        if spec.kind == "json_schema":
            return compiler.compile_json_schema(spec.source, any_whitespace=spec.any_whitespace,
                                                strict_mode=spec.strict)
        if spec.kind == "ebnf":
            return compiler.compile_grammar(spec.source)
        if spec.kind == "regex":
            return compiler.compile_regex(spec.source)
        if spec.kind == "choice":
            choices = json.loads(spec.source)
            return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in choices))
        raise GrammarCompileError(f"unknown constraint kind {spec.kind!r}")

    def state(self, compiled) -> GrammarState:
        return GrammarState(compiled, self.vocab_size, self.stop_ids)


class GrammarState:
    """One request's matcher, used as the last logits processor. Runs on the
    engine thread. `finished` turns true once the accepted text completes the
    grammar and nothing but a stop token could follow."""

    def __init__(self, compiled, vocab_size: int, stop_ids: list[int]):
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._vocab_size = vocab_size
        self._stop_ids = set(stop_ids)
        self._started = False
        self.finished = False

    def __call__(self, tokens, logits):
        import mlx.core as mx
        from xgrammar.kernels.apply_token_bitmask_mlx import apply_token_bitmask_mlx

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

    def _only_stop_allowed(self) -> bool:
        import numpy as np

        bits = np.unpackbits(self._bitmask.numpy().view(np.uint8), bitorder="little")[: self._vocab_size]
        return set(np.flatnonzero(bits).tolist()) <= self._stop_ids
