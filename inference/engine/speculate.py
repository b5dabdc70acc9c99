"""Speculative decoding: guess a few tokens cheaply, check them all with one
forward of the served model, keep the ones it agrees with.

A round starts from the context with its last token not yet in the KV cache.
The drafter proposes up to k tokens; one forward over [last, d1..dk] gives
the model's own choice after each of them, sampled with the row's sampler
and processors exactly as plain decoding would; the drafts are accepted
while they equal those choices, and the model's choice after the last
accepted one comes free. The KV entries of the rejected drafts are trimmed
away. Each verified position is sampled on its own, a seeded row with the
key plain decoding would use for that token (the key is set back to follow
the last token kept). So a seeded or greedy row gives what plain decoding
gives, up to float rounding: the verify forward computes several positions
at once, and a near-tie that rounding decides could differ (the tests have
not seen one). Every token is a sample from the model's distribution given
what precedes it.

A sliding-window (rotating) KV cache can only be rewound until it wraps, so
near its window a round drafts nothing (a plain step). The prompt is
prefilled one chunk per engine step, the draft model's copy after it, so a
request that arrives meanwhile joins the batch without waiting for it.

Two drafters:
  `NgramDrafter`   prompt lookup: the longest recent n-gram (3, 2, then 1
                   token) that occurred earlier in the context proposes what
                   followed it there. No model; it pays off where the answer
                   copies from the prompt (code edits, quoting, extraction).
  `ModelDrafter`   a small model with the same tokenizer proposes greedily,
                   keeping its own KV cache in step with the accepted tokens.

mlx-lm's `speculative_generate_step` has the verify rule but drafts a fixed
number of tokens with a model on every round; prompt lookup needs a draft
count that can be zero (no match: a plain step, not a wasted wide one), and
the engine needs a row that can leave for the batch lane between rounds,
so the round is written here.

Jump-forward decoding rides the same single-row path: a lone request under
a grammar (no seed, no adapter, no think bound, not opted out) asks its matcher, before each
forward, for the text the grammar allows next and nothing else (xgrammar's
jump-forward string: `{"name": "` after `{`, a schema's next key), appends
its tokens without sampling them, and runs one forward over the last token
and the forced ones: the forced tokens advance the KV cache together, and
the logits after the last one give the next free token, masked and sampled
as usual. The forced tokens are output like any other (`usage.fill` counts
them). mlx-lm's BatchGenerator decodes one token per row per step, so a
grammar row in a batch decodes plainly.

`Speculating` wraps the engine's lane: a lone eligible request (for drafts:
no grammar, no adapter, not opted out; for jump-forward: above) decodes
here; when another request is admitted the row moves to the wrapped lane
with its KV cache, and the batch takes them both. The wrapped lane runs
everything else.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from inference.engine import lanes
from inference.engine.rows import Row
from inference.engine.sampling import make_processors, make_sampler

if TYPE_CHECKING:
    from inference.engine.loader import LoadedModel

log = logging.getLogger("hearth.engine")

PREFILL_STEP = 512
NGRAM_MAX = 3
FILL_MAX = 256  # most forced tokens appended in one forward
JUMP_TRIAL = 16  # sampled tokens after which a jump-forward row that appends less than it samples moves on


@dataclass
class SpecTotals:
    """Counters for /stats, over every speculating row."""

    rows: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    fill_rows: int = 0  # rows decoded with jump-forward
    fill_events: int = 0  # forced spans appended
    injected: int = 0  # forced tokens appended without a sampling step


class NgramDrafter:
    """Prompt lookup over one row's token history."""

    kind = "ngram"

    def __init__(self, draft_tokens: int):
        self.k = draft_tokens
        self.index: list[dict[tuple[int, ...], int]] = []
        self.upto = 0

    def start(self, context: list[int]) -> None:
        self.index = [{} for _ in range(NGRAM_MAX + 1)]
        self.upto = 0

    def _extend(self, history: list[int]) -> None:
        # n-grams ending at j, for every j that has a token after it (the last
        # position is the suffix being looked up, not a match for itself).
        for j in range(self.upto, len(history) - 1):
            for n in range(1, NGRAM_MAX + 1):
                if j - n + 1 >= 0:
                    self.index[n][tuple(history[j - n + 1:j + 1])] = j
        self.upto = max(self.upto, len(history) - 1)

    def propose(self, history: list[int], k: int) -> list[int]:
        self._extend(history)
        for n in range(min(NGRAM_MAX, len(history)), 0, -1):
            at = self.index[n].get(tuple(history[-n:]))
            if at is not None:
                return history[at + 1:at + 1 + k]
        return []

    def settle(self, history: list[int], drafted: int, accepted: int) -> None:
        pass

    def prefill(self, history: list[int]) -> bool:
        return True

    def close(self) -> None:
        self.index = []


class ModelDrafter:
    """A small model of the same tokenizer, drafting greedily with its own
    KV cache, which holds `seen` tokens of the row's history."""

    kind = "model"

    def __init__(self, model: LoadedModel, draft_tokens: int):
        self.model = model
        self.k = draft_tokens
        self.cache: list | None = None
        self.seen = 0

    def start(self, context: list[int]) -> None:
        from mlx_lm.models.cache import make_prompt_cache

        self.cache = make_prompt_cache(self.model.model)
        self.seen = 0

    def prefill(self, history: list[int]) -> bool:
        """Take one chunk of what it has not seen, but the last token; True once caught up."""
        import mlx.core as mx

        assert self.cache is not None
        if self.seen >= len(history) - 1:
            return True
        end = min(self.seen + PREFILL_STEP, len(history) - 1)
        self.model.model(mx.array(history[self.seen:end])[None], cache=self.cache)
        mx.eval([c.state for c in self.cache])
        self.seen = end
        return self.seen >= len(history) - 1

    def propose(self, history: list[int], k: int) -> list[int]:
        import mlx.core as mx

        assert self.cache is not None
        if k <= 0:
            return []
        pending = history[self.seen:]
        drafts: list[int] = []
        y = mx.array(pending)
        for i in range(k):
            logits = self.model.model(y[None], cache=self.cache)[:, -1, :]
            token = mx.argmax(logits, axis=-1)
            drafts.append(cast(int, token.item()))
            if i < k - 1:
                y = token
        self.seen = len(history) + max(k - 1, 0)
        return drafts

    def settle(self, history: list[int], drafted: int, accepted: int) -> None:
        """Drop the drafted tokens the model rejected from the draft cache."""
        from mlx_lm.models.cache import trim_prompt_cache

        if not drafted or self.cache is None:
            return
        fed = drafted - 1  # the last draft was proposed but never fed
        keep = min(accepted, fed)
        if fed > keep:
            trim_prompt_cache(self.cache, fed - keep)
        self.seen -= fed - keep

    def close(self) -> None:
        self.cache = None


Drafter = NgramDrafter | ModelDrafter


class Speculating:
    """The engine's lane, with one row at a time decoded speculatively."""

    def __init__(self, inner: lanes.Lane, model: LoadedModel, drafter: Drafter | None, totals: SpecTotals,
                 jump: bool = False):
        self.inner = inner
        self.model = model
        self.drafter = drafter  # None: no draft source, jump-forward only
        self.jump = jump
        self.totals = totals
        self.special = lanes._special_ids(model)
        self.name = inner.name
        self.row: Row | None = None
        self._cache: list | None = None
        self._held = 0  # context tokens the cache holds (all but the last, once prefilled)
        self._processors: list = []
        self._jumping = False  # the row decodes with jump-forward, not drafts
        self.faults = 0

    # -- the lane interface --------------------------------------------------
    @property
    def active(self) -> int:
        row = self.row  # read once: other threads ask too
        return self.inner.active + (1 if row is not None else 0)

    @property
    def prefilling(self) -> int:
        return self.inner.prefilling

    def all_rows(self) -> list[Row]:
        row = self.row
        return self.inner.all_rows() + ([row] if row is not None else [])

    def take_faults(self) -> int:
        faults, self.faults = self.faults, 0
        return faults + self.inner.take_faults()

    def jumps(self, row: Row) -> bool:
        """A row for jump-forward: under a grammar, with no seed (a seeded
        row draws what plain decoding draws), adapter or think bound, and not
        opted out (`speculative: false`: every token sampled, one a step)."""
        req = row.req
        return (self.jump and req.grammar is not None and req.think is None and req.sampling.seed is None
                and not row.adapters and not row.restarts and req.speculative)

    def eligible(self, row: Row) -> bool:
        req = row.req
        return self.jumps(row) or (self.drafter is not None and req.grammar is None and req.think is None
                                   and not row.adapters and req.speculative and not row.restarts)

    def add(self, row: Row, cache: list | None, cached: int) -> None:
        if self.row is None and not self.inner.active and self.eligible(row):
            self._begin(row, cache, cached)
            return
        if self.row is not None:
            self._move_to_inner()
        self.inner.add(row, cache, cached)

    def step(self) -> lanes.Published:
        if self.row is None:
            return self.inner.step()
        return self._step()

    def fail_all(self, message: str) -> None:
        if self.row is not None:
            row = self.row
            self._finish()
            row.fail(message)
        self.inner.fail_all(message)

    # -- the speculating row -------------------------------------------------
    def _begin(self, row: Row, cache: list | None, cached: int) -> None:
        from mlx_lm.models.cache import make_prompt_cache

        if row.sampler is None:
            row.sampler = make_sampler(row.req, self.special)
        self._jumping = self.jumps(row)
        if self._jumping:
            row.fill = row.fill or {"events": 0, "injected": 0, "strict": 0, "spanLens": [], "decodeSteps": 0}
            self.totals.fill_rows += 1
        else:
            assert self.drafter is not None
            row.spec = row.spec or {"drafted": 0, "accepted": 0, "targetCalls": 0}
            self.drafter.start(row.context())
            self.totals.rows += 1
        row.lane = row.generation.lane = "serial"
        self.row = row
        self._cache = cache if cache is not None else make_prompt_cache(self.model.model)
        self._held = cached if cache is not None else 0
        self._processors = make_processors(row.req)

    def _move_to_inner(self) -> None:
        """Hand the row and its KV cache to the wrapped lane (another request came)."""
        row, cache, held = self.row, self._cache, self._held
        assert row is not None
        self._finish()
        row.lane = row.generation.lane = self.inner.name
        try:
            self.inner.add(row, cache, held)
        except Exception as exc:
            log.exception("could not move request %s to the %s lane", row.req.id, self.inner.name)
            row.fault = exc
            lanes.fail_faulty(row)

    def _finish(self) -> None:
        self.row, self._cache, self._processors = None, None, []
        if self.drafter is not None and not self._jumping:
            self.drafter.close()
        self._jumping = False

    def _step(self) -> lanes.Published:
        row = self.row
        assert row is not None and self._cache is not None
        if row.aborted:
            published = self._publish(row)
            self._finish()
            lanes.close_row(row)
            return published
        done = False
        try:
            context = row.context()
            if self._held < len(context) - 1:
                self._prefill_chunk(context)  # one chunk per engine step: others may join meanwhile
            elif self._jumping:
                done = self._jump_round(row)
            elif self.drafter is not None and self.drafter.prefill(context):
                done = self._round(row)
        except Exception as exc:
            row.fault = exc
        if row.fault is not None:
            self._finish()
            lanes.fail_faulty(row)
            self.faults += 1
            return [(None, None, row)]
        if not done:
            if self._jumping and self._jump_does_not_pay(row):
                self._move_to_inner()  # mostly free text: the batch lane's pipelined steps are faster
            return []
        if row.spec and row.spec["accepted"]:
            row.lane = row.generation.lane = "serial+spec"
        published = self._publish(row)
        self._finish()
        lanes.close_row(row)
        return published

    def _publish(self, row: Row) -> lanes.Published:
        """The cache holds every context token but the last: kept for those."""
        context = row.context()
        if not row.count or self._held != len(context) - 1:
            return [(None, None, row)]
        return [(context[:-1], self._cache, row)]

    def _prefill_chunk(self, context: list[int]) -> None:
        import mlx.core as mx

        cache = self._cache
        assert cache is not None
        end = min(self._held + PREFILL_STEP, len(context) - 1)
        self.model.model(mx.array(context[self._held:end])[None], cache=cache)
        mx.eval([c.state for c in cache])
        self._held = end

    def _rewindable(self) -> int:
        """How many tokens a round may add and still trim: a rotating cache
        cannot be rewound once it wraps."""
        room = 1 << 30
        for c in self._cache or []:
            size = getattr(c, "max_size", None)
            if size:
                room = min(room, size - c.offset)
        return room

    def _jump_round(self, row: Row) -> bool:
        """One forward over the last token and the tokens the grammar forces
        after it (often none), then the next free token sampled; True once
        the row is finished."""
        import mlx.core as mx

        grammar, fill = row.req.grammar, row.fill
        assert grammar is not None and fill is not None and row.sampler is not None
        context = row.context()
        # Not bounded by _rewindable(): forced tokens stay, a rotating cache takes them as it takes a
        # prefill; only a stop string inside the span would rewind (and a cache that cannot is not kept).
        most = min(row.limit - row.count - 1, FILL_MAX)
        forced = grammar.forced(context[-1], self.model.tokenizer, most)
        logits = self.model.model(mx.array(context[-1:] + forced)[None], cache=self._cache)[0]  # (1 + f, vocab)
        self._held = len(context) + len(forced)  # the forward took the last token and every forced one
        fill["decodeSteps"] += 1
        if forced:
            fill["events"] += 1
            fill["injected"] += len(forced)
            fill["strict"] += len(forced)
            fill["spanLens"].append(len(forced))
            self.totals.fill_events += 1
            self.totals.injected += len(forced)
            spans = logits[:-1]
            lp = spans - mx.logsumexp(spans, axis=-1, keepdims=True) if row.want_logprobs else spans
            for i, token in enumerate(forced):
                if lanes._feed(row, token, lp[i]):  # a stop string inside the span: the KV holds the rest
                    self._rewind(len(row.context()) - 1)
                    return True
        last = logits[-1:]
        seen = mx.array(row.context())
        for processor in self._processors:  # the grammar masks the position after the forced span
            last = processor(seen, last)
        logprobs = last - mx.logsumexp(last, axis=-1, keepdims=True)
        token = row.sampler(logprobs)
        mx.eval(token, logprobs)
        return lanes._feed(row, cast(int, token.item()), logprobs[0])

    def _jump_does_not_pay(self, row: Row) -> bool:
        """Whether a jump-forward row writes mostly free text: after JUMP_TRIAL
        sampled tokens, fewer appended tokens than sampled ones. Its forwards
        here are plain steps that the batch lane runs faster (measured: 23.1
        against 18.8 tok/s for a regex over letters), so it moves there."""
        fill = row.fill
        return fill is not None and fill["decodeSteps"] >= JUMP_TRIAL and fill["injected"] < fill["decodeSteps"]

    def _rewind(self, keep: int) -> None:
        """Trim the KV cache back to `keep` tokens; one that cannot be is not kept for reuse."""
        from mlx_lm.models.cache import trim_prompt_cache

        if self._held > keep and self._cache is not None:
            trimmed = trim_prompt_cache(self._cache, self._held - keep)
            self._held = keep if trimmed == self._held - keep else -1

    def _round(self, row: Row) -> bool:
        """One draft-and-verify round; True once the row is finished."""
        import mlx.core as mx
        from mlx_lm.models.cache import trim_prompt_cache

        drafter = self.drafter
        assert drafter is not None
        context = row.context()
        room = max(row.limit - row.count, 1)
        k = min(drafter.k, room - 1, self._rewindable() - 1)
        drafts = drafter.propose(context, k) if k > 0 else []
        inputs = mx.array(context[-1:] + drafts)
        logits = self.model.model(inputs[None], cache=self._cache)[0]  # (1 + k, vocab)
        spec = row.spec
        assert spec is not None
        spec["targetCalls"] += 1
        self.totals.target_calls += 1
        if self._processors:
            history = mx.array(context)
            rows = []
            for i in range(len(drafts) + 1):
                seen = history if i == 0 else mx.concatenate([history, mx.array(drafts[:i])])
                out = logits[i:i + 1]
                for processor in self._processors:
                    out = processor(seen, out)
                rows.append(out)
            logits = mx.concatenate(rows, axis=0)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampler: Any = row.sampler  # a seeded one (sampling._SeededSampler) has a `key`
        assert sampler is not None
        # One draw per position, as plain decoding draws one per token; a
        # seeded sampler's key after each draw is kept to set it back after
        # the last token kept.
        seeded = hasattr(sampler, "key")
        draws, keys = [], []
        for i in range(len(drafts) + 1):
            draws.append(sampler(logprobs[i:i + 1]))
            if seeded:
                keys.append(sampler.key)
        chosen = mx.concatenate(draws, axis=0)
        mx.eval(chosen, logprobs)
        picks = cast("list[int]", chosen.tolist())
        accepted = 0
        while accepted < len(drafts) and picks[accepted] == drafts[accepted]:
            accepted += 1
        spec["drafted"] += len(drafts)
        spec["accepted"] += accepted
        self.totals.drafted += len(drafts)
        self.totals.accepted += accepted
        self._held = len(context) + len(drafts)  # the forward took the last token and every draft
        done = False
        fed = 0
        for i in range(accepted + 1):
            fed += 1
            if lanes._feed(row, picks[i], logprobs[i]):
                done = True
                break
        if seeded:
            sampler.key = keys[fed - 1]
        # Keep the KV of the context plus the accepted tokens that were fed, all but the newest.
        keep = len(context) + fed - 1
        if self._held > keep:
            assert self._cache is not None
            trimmed = trim_prompt_cache(self._cache, self._held - keep)
            if trimmed != self._held - keep:  # _rewindable() should have kept this from happening
                raise RuntimeError(f"the KV cache could not be rewound ({trimmed} of {self._held - keep} tokens)")
            self._held = keep
        drafter.settle(row.context(), len(drafts), min(accepted, fed))
        return done


AnyLane = lanes.Lane | Speculating  # what the engine steps: a plain lane, or one that drafts
