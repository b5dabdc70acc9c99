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

A lone request that neither drafts nor jumps still decodes here when the
wrapped lane is the batch lane: plain pipelined steps in `generate_step`'s
order (the forward of the token just sampled is queued before that token is
read, so the device computes the next one while this one is detokenized and
sent), without the batch machinery's per-step work (a batched KV cache and
its masks, per-row slices of the logits, the stop matchers, the response
objects), which shows where a step's compute is small (a fast device, a
small model).
A greedy row that asks for no logprobs is sampled from the logits (the
argmax is the same), so no log-softmax over the vocabulary is computed for it.
mlx-lm's `generate_step` itself cannot be used: it always runs one forward
ahead of what it has handed out, so a row could only leave it for the batch
by trimming its KV cache, which a sliding-window or recurrent cache cannot;
here the token in flight is taken and handed out first (`_move_to_inner`).

`Speculating` wraps the engine's lane: a lone eligible request (for drafts:
no grammar, no adapter, not opted out; for jump-forward: above; for plain
steps: any request not restarted after a failed step, when the wrapped lane
is the batch lane) decodes here; when another request is admitted the row
moves to the wrapped lane with its KV cache, and the batch takes them both.
The wrapped lane runs everything else.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from inference.engine import lanes
from inference.engine.rows import Row
from inference.engine.sampling import greedy, make_processors, make_sampler, sample

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
        self._held = 0  # context tokens the cache holds (all but the last once prefilled; all, with a step queued)
        self._processors: list = []
        self._mode = "plain"  # how the row decodes: "plain", "draft" or "jump"
        self._queued: tuple[Any, Any] | None = None  # plain steps: the next token and its logprobs, in flight
        self._seen: Any = None  # plain steps with processors: the context as an MLX buffer (mlx-lm's TokenBuffer)
        self._ended: lanes.Published = []  # rows that ended while moving to the wrapped lane, published next step
        self.faults = 0

    # -- the lane interface --------------------------------------------------
    @property
    def active(self) -> int:
        row = self.row  # read once: other threads ask too
        return self.inner.active + (1 if row is not None else 0) + len(self._ended)

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

    def drafts(self, row: Row) -> bool:
        """A row for drafts: a draft source, no grammar, think bound or adapter, not opted out."""
        req = row.req
        return (self.drafter is not None and req.grammar is None and req.think is None and not row.adapters
                and req.speculative and not row.restarts)

    @property
    def plain_steps(self) -> bool:
        """Whether a lone row that neither drafts nor jumps decodes here: the wrapped lane is the batch
        lane (the serial lane already decodes one row on `generate_step`)."""
        return isinstance(self.inner, lanes.BatchLane)

    def eligible(self, row: Row) -> bool:
        return self.jumps(row) or self.drafts(row) or (self.plain_steps and not row.restarts)

    def add(self, row: Row, cache: list | None, cached: int) -> None:
        if self.row is None and not self.inner.active and self.eligible(row):
            self._begin(row, cache, cached)
            return
        if self.row is not None:
            self._move_to_inner()
        self.inner.add(row, cache, cached)

    def step(self) -> lanes.Published:
        ended, self._ended = self._ended, []
        return ended + (self.inner.step() if self.row is None else self._step())

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
        self._mode = "jump" if self.jumps(row) else "draft" if self.drafts(row) else "plain"
        if self._mode == "jump":
            row.fill = row.fill or {"events": 0, "injected": 0, "strict": 0, "spanLens": [], "decodeSteps": 0}
            self.totals.fill_rows += 1
        elif self._mode == "draft":
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
        """Hand the row and its KV cache to the wrapped lane (another request came). A plain step's token
        in flight is handed out first: the cache then holds every context token but the last, as the
        wrapped lane takes it. A row that ends with that token is published with the next step."""
        row = self.row
        assert row is not None
        if self._queued is not None and self._take_queued(row):  # a failure there is the row's own
            self._ended += [(None, None, row)] if row.fault is not None else self._publish(row)
            self._finish()
            if row.fault is not None:
                lanes.fail_faulty(row)
                self.faults += 1
            else:
                lanes.close_row(row)
            return
        cache, held = self._cache, self._held
        row.lane = row.generation.lane = self.inner.name
        try:
            self.inner.add(row, cache, held)  # before this lane lets go of it: `active` never misses the row
        except Exception as exc:
            log.exception("could not move request %s to the %s lane", row.req.id, self.inner.name)
            row.fault = exc
            lanes.fail_faulty(row)
        finally:
            self._finish()

    def _finish(self) -> None:
        self.row, self._cache, self._processors, self._queued, self._seen = None, None, [], None, None
        if self.drafter is not None and self._mode == "draft":
            self.drafter.close()
        self._mode = "plain"

    def _step(self) -> lanes.Published:
        row = self.row
        assert row is not None and self._cache is not None
        if row.aborted:
            published = self._publish(row)
            self._finish()
            lanes.close_row(row)
            return published
        done = False
        prefilled = self._held >= len(row.req.prompt_tokens) + len(row.generated) - 1
        try:
            if not prefilled:
                self._prefill_chunk(row.context())  # one chunk per engine step: others may join meanwhile
            elif self._mode == "jump":
                done = self._jump_round(row)
            elif self._mode == "draft" and self.drafter is not None and self.drafter.prefill(row.context()):
                done = self._round(row)
        except Exception as exc:
            row.fault = exc
        if prefilled and self._mode == "plain":
            # As in the batch lane: the row's own processors, sampler and detokenizer fail the row alone;
            # anything else (the forward, the evaluation) fails the step, which Engine._recover restarts.
            done = self._plain_round(row)
        if row.fault is not None:
            self._finish()
            lanes.fail_faulty(row)
            self.faults += 1
            return [(None, None, row)]
        if not done:
            if self._mode == "jump" and self._jump_does_not_pay(row):
                if self.plain_steps:
                    self._mode = "plain"  # mostly free text: pipelined plain steps are faster
                else:
                    self._move_to_inner()  # the serial lane's pipelined steps are
            return []
        if row.spec and row.spec["accepted"]:
            row.lane = row.generation.lane = "serial+spec"
        published = self._publish(row)
        self._finish()
        lanes.close_row(row)
        return published

    def _publish(self, row: Row) -> lanes.Published:
        """The cache holds every context token but the last (all of them after a plain step queued the
        next): kept for those."""
        context = row.context()
        if not row.count or self._held not in (len(context) - 1, len(context)):
            return [(None, None, row)]
        return [(context[:self._held], self._cache, row)]

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
        if grammar.finished:  # only a stop token may follow: the row ends without sampling it, as in a batch
            row.finish = row.finish or "stop"
            return True
        fill["decodeSteps"] += 1
        logprobs = last - mx.logsumexp(last, axis=-1, keepdims=True)
        token = sample(row.sampler, last, logprobs)
        mx.eval(token, logprobs)
        return lanes._feed(row, cast(int, token.item()), logprobs[0])

    def _plain_round(self, row: Row) -> bool:
        """One plain step: queue the forward of the token sampled last step (taken now, its value still
        unread), then read that token and hand it to the row; True once the row is finished. The first
        step after the prefill, or after a jump-forward, queues the forward of the context's last token
        first. No step is queued past the row's token limit."""
        import mlx.core as mx

        if self._queued is None:
            last = row.generated[-1] if row.generated else row.req.prompt_tokens[-1]
            self._queued = self._queue_step(row, mx.array([last], dtype=mx.uint32))
            if row.fault is not None:
                return True  # its processors or sampler failed on the token it would hand out now
        token, logprobs = self._queued
        self._queued = self._queue_step(row, token) if row.count + 1 < row.limit else None
        return self._hand_out(row, token, logprobs)

    def _take_queued(self, row: Row) -> bool:
        """Hand out the plain step's token in flight (the row is leaving); True once the row is finished."""
        assert self._queued is not None
        (token, logprobs), self._queued = self._queued, None
        try:
            return self._hand_out(row, token, logprobs)
        except Exception as exc:  # its sampler or processors, evaluated now
            row.fault = exc
            return True

    def _hand_out(self, row: Row, token, logprobs) -> bool:
        n = len(row.req.prompt_tokens) + len(row.generated)
        self._held = n + (1 if self._queued is not None else 0)  # the queued step's forward took the token
        if row.count % 256 == 255:
            import mlx.core as mx

            mx.clear_cache()  # as generate_step does: MLX's buffer cache stays small over a long reply
        return lanes._feed(row, cast(int, token.item()), logprobs[0] if logprobs is not None else None)

    def _queue_step(self, row: Row, inputs) -> tuple[Any, Any]:
        """The model's forward of `inputs` (one token, the last of the context), the row's processors
        and its sampler, queued on the device: (token, logprobs or None), both unread."""
        import mlx.core as mx
        from mlx_lm.models.cache import TokenBuffer

        logits = self.model.model(inputs[None], cache=self._cache)[:, -1, :]
        if self._processors and row.fault is None:
            if self._seen is None:  # the context but its last token, which `inputs` holds
                self._seen = TokenBuffer(row.context()[:-1])
            seen = self._seen.update_and_fetch(inputs)
            try:
                for processor in self._processors:
                    logits = processor(seen, logits)
            except Exception as exc:  # the row's own: it ends once the token it has is handed out
                row.fault = exc
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True) \
            if row.want_logprobs or not greedy(row.sampler) else None
        try:
            token = sample(row.sampler, logits, logprobs)
        except Exception as exc:
            row.fault = row.fault or exc
            token = mx.argmax(logits, axis=-1)  # a stand-in, never handed out
        mx.async_eval(token, *([] if logprobs is None else [logprobs]))
        return token, logprobs

    def _jump_does_not_pay(self, row: Row) -> bool:
        """Whether a jump-forward row writes mostly free text: after JUMP_TRIAL
        sampled tokens, fewer appended tokens than sampled ones. Its forwards
        here are unpipelined steps, slower than pipelined ones (measured: the
        batch lane's 23.1 against 18.8 tok/s for a regex over letters), so it
        goes on in plain steps (or on the serial lane)."""
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
            draws.append(sample(sampler, logits[i:i + 1], logprobs[i:i + 1]))
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
