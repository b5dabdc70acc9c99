"""The two execution lanes. Both run only on the engine thread.

`BatchLane` is continuous batching on mlx-lm's `BatchGenerator`: every row
has its own sampling settings, logits processors (penalties, bias,
grammar), token limit and prompt cache; new rows join between decode steps,
and a long prompt is prefilled one chunk per step so the other rows keep
decoding. A step prefills 8 prompts, or more short ones within the tokens
of 8 chunks (`BatchLane._plan_prefill`); a row with nothing to
prefill starts with the prompts whose prefill ends that step
(`BatchLane._start_joining`). Rows with the same unseeded settings share
one sampler (`BatchLane.batch_sampler`), and the rows' logit biases and
penalties are applied in one operation a kind (`_batched`); the logprobs
and top tokens of the rows that ask are computed with the step and read
once for all of them (`_StepLogprobs`). A step whose rows are all greedy and ask for
no logprobs samples the logits as they are (`lean_generation_batch`): no
log-softmax over the vocabulary. The engine wraps it (`speculate.Speculating`)
so that a request running alone decodes without the batch machinery and
moves in when a second one comes.

`SerialLane` runs one row at a time on `generate_step`; it serves
`--batch 1`, quantized KV caches (mlx-lm cannot merge them into a batch)
and models whose cache cannot be batched.

`step()` returns (tokens, cache, row) for every row that ended; tokens and
cache are what its KV cache holds, for the prompt cache to keep, or None
when nothing is worth keeping (a row aborted before it decoded).

One row's failure ends that row only. Its logits processors, and a seeded
row's sampler, run behind a guard: an exception there is kept on the row (`row.fault`), a
stand-in token lets the batched step finish for the others, and the row is
ended with the error before that token is shown; so is a row whose own
detokenizing or logprob entry fails (a batched step computes the entries'
numbers with the step; the text of each is the row's own). A failure the guards cannot pin on a row (MLX
evaluates lazily, so some surface only when the whole batch is evaluated)
is handled by the engine: `suspect()` finds the rows whose own sampling
fails when tried alone, and the others continue on a fresh lane from what
they had generated (`Row.context()`).
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from inference.engine.rows import Row
from inference.engine.sampling import (
    LogitBias,
    Penalty,
    TokenLogprobs,
    greedy,
    make_processors,
    make_sampler,
    sample,
    top_logprobs,
)

if TYPE_CHECKING:
    from inference.engine.loader import LoadedModel

log = logging.getLogger("hearth.engine")

# (tokens, cache, row) per ended row; tokens and cache are None when nothing is worth keeping.
Published = list[tuple[list[int] | None, list | None, Row]]


def _special_ids(model: LoadedModel) -> list[int]:
    return model.newline_ids + sorted(model.tokenizer.eos_token_ids)


class BatchLane:
    name = "batched"

    def __init__(self, model: LoadedModel, size: int, prefill_chunk: int, prefill_rows: int = 8):
        from mlx_lm.generate import BatchGenerator, StopSequences

        self.model = model
        self.gen = BatchGenerator(model.model, completion_batch_size=size, prefill_batch_size=min(size, prefill_rows),
                                  prefill_step_size=prefill_chunk)
        self.prefill_rows = min(size, prefill_rows)
        self.prefill_budget = prefill_rows * prefill_chunk  # prompt tokens (padding included) a step prefills
        # rows that asked for logprobs, and how many top tokens: their steps are normalized
        self.logprob_uids: dict[int, int] = {}
        lean_generation_batch(self.gen, self.logprob_uids)
        self.eos = StopSequences([[t] for t in sorted(model.tokenizer.eos_token_ids)])
        self.rows: dict[int, Row] = {}
        self.special = _special_ids(model)
        self.shared_samplers: dict[tuple, object] = {}  # `batch_sampler`'s, by sampling settings
        # `add`'s rows with nothing to prefill, waiting (True once held back a step): `_start_joining`
        self.joining: list[tuple[Row, list, int, bool]] = []
        self.faults = 0

    def take_faults(self) -> int:
        """Rows ended by their own failure since the last call."""
        faults, self.faults = self.faults, 0
        return faults

    @property
    def active(self) -> int:
        return len(self.rows) + len(self.joining)

    def all_rows(self) -> list[Row]:
        return list(self.rows.values()) + [row for row, *_ in list(self.joining)]

    @property
    def prefilling(self) -> int:
        decoding = set(self.gen._generation_batch.uids)
        # read from other threads too
        return sum(1 for uid in list(self.rows) if uid not in decoding) + len(self.joining)

    def add(self, row: Row, cache: list | None, cached: int) -> None:
        if row.sampler is None:
            row.sampler = make_sampler(row.req, self.special)
        restart_row_state(row)
        if cache is not None and not row.generated and len(row.context()) - cached == 1:
            self.joining.append((row, cache, cached, False))
            return
        self._insert(row, cache, cached)

    def _start_joining(self) -> Published:
        """Insert the rows that came with their whole prompt but the last token in cache (a lone request
        prefilled alone just before others came, a full prompt-cache hit), now or after this step. mlx-lm
        would start such a row decoding at once and, a step later, merge the group it was prefilling
        meanwhile into that running batch: a one-row decode step, then a merge that copies every row's
        KV buffer. Raw mlx-lm, 7 prompts of 45 tokens and one such row, 103M model on the 2-core test
        CPU: first tokens 845-872 ms after the insert that way, 778-791 when the row starts with the
        group. So while mlx-lm's next step prefills some prompt to its end, a held row waits that one
        step (never more), to be split off with them; otherwise it goes in now."""
        out: Published = []
        waiting = []
        ends = any(not waited for *_, waited in self.joining) and self._plan_prefill()[1]
        for row, cache, cached, waited in self.joining:
            if row.aborted:  # its prompt was prefilled: kept for the prompt cache
                out.append((row.context()[:cached], cache, row))
                close_row(row)
            elif ends and not waited:
                waiting.append((row, cache, cached, True))
            else:
                try:
                    self._insert(row, cache, cached)
                except Exception as exc:  # as Engine._start's: this row fails, the others go on
                    log.exception("could not start request %s", row.req.id)
                    row.fail(fault_message(exc))
        self.joining = waiting  # replaced, not emptied first: `active`, read from other threads, never misses one
        return out

    def _plan_prefill(self) -> tuple[int | None, bool]:
        """mlx-lm's next step, planned from its queues: how many prompts it should take into its prefill
        group, and whether it prefills some prompt to its end (all but the last token, which mlx-lm
        keeps for the decode's first forward).

        The group is `prefill_rows` (8) prompts, or more while their chunks, padded to the longest (mlx-lm
        pads a group's chunks to one length), fit in the tokens of 8 full chunks; a row with only its last
        token to go costs nothing there (mlx-lm splits it off before the prefill). A step never prefills
        more than 8 full chunks did, and a burst of short prompts is prefilled in one step, not one step of
        8 each: mlx-lm hands out no first token of a group before the step after it splits the group off,
        and that step prefills the next group, so in groups of 8 a burst's first tokens wait for most of
        its prefill anyway, plus a decode step and a merge a group. Raw mlx-lm, 32 prompts of 45 tokens at
        once, 103M model, 2-core CPU: median first token 3.05-3.30 s either way, the last 2.96-3.31 s in
        one group against 4.20-4.53 in groups of 8 (a GPU, where more rows cost a prefill little, is
        where the gain should be largest: issue 43's table will say).

        Read from mlx-lm 0.32.2's queues (`_currently_processing`: [segments, done, total];
        `_unprocessed_sequences`: (uid, segments, ...)); where they are not that shape, (None, False):
        mlx-lm's own fixed group, and held rows go in at once."""
        gen, chunk = self.gen, self.gen.prefill_step_size
        try:
            processing = [seq[0] for seq in gen._currently_processing]
            queued = [seq[1] for seq in gen._unprocessed_sequences]
            room = gen.completion_batch_size - len(gen._generation_batch)
            widths = [0 if len(s) == 1 and len(s[0]) == 1 else min(len(s[0]), chunk) for s in processing + queued]
        except (AttributeError, IndexError, TypeError):
            _queue_layout_unknown()
            return None, False
        slots, prompted = len(processing), [w for w in widths[:len(processing)] if w]
        admitted = 0
        for width in widths[len(processing):]:
            if admitted >= room or (width and slots >= self.prefill_rows
                                    and (len(prompted) + 1) * max(prompted + [width]) > self.prefill_budget):
                break
            slots, admitted = slots + 1, admitted + 1
            if width:
                prompted.append(width)
        planned = processing + queued[:admitted]
        ends = any(len(s) == 2 and len(s[0]) <= chunk for s in planned)
        return max(slots, self.prefill_rows), ends

    def _insert(self, row: Row, cache: list | None, cached: int) -> None:
        tokens = row.context()
        (uid,) = self.gen.insert(
            [tokens[cached:]], max_tokens=[row.remaining], caches=[cache] if cache is not None else None,
            all_tokens=[tokens[:cached]], samplers=[self.batch_sampler(row)],
            logits_processors=[[guard_processor(p, row) for p in make_processors(row.req)]],
            stop_sequences=[self.eos])
        self.rows[uid] = row
        if row.want_logprobs:
            self.logprob_uids[uid] = row.req.top_logprobs

    def batch_sampler(self, row: Row):
        """The sampler `row` decodes with in the batch. Rows with the same
        unseeded settings share one object, and mlx-lm samples a batch whose
        rows share one in a single call (one argmax over the greedy rows,
        not a slice, an argmax and a concatenation per row every step). A
        shared sampler is not guarded: a step it fails is recovered whole
        (`Engine._recover` finds the row by sampling each alone). A seeded
        row keeps its own key, guarded, and so does an XTC row (one call
        would draw one XTC coin for every row it samples)."""
        s = row.req.sampling
        if s.temperature != 0 and (s.seed is not None or s.xtc_probability > 0):
            return guard_sampler(row.sampler, row)
        key = (s.temperature, s.top_p, s.min_p, s.top_k, s.xtc_threshold) if s.temperature != 0 else ("greedy",)
        if key not in self.shared_samplers:
            if len(self.shared_samplers) >= 64:  # a bound: rows running keep theirs, new ones share anew
                self.shared_samplers.clear()
            self.shared_samplers[key] = make_sampler(row.req, self.special)
        return self.shared_samplers[key]

    def step(self) -> Published:
        published: Published = []
        gone = [uid for uid, row in self.rows.items() if row.aborted]
        if gone:
            published += self._remove(gone)
        if self.joining:
            published += self._start_joining()
        if not self.rows:
            return published
        group, _ = self._plan_prefill()
        if group is not None:
            self.gen.prefill_batch_size = group
        _, responses = self.gen.next()
        ended = []
        for r in responses:
            row = self.rows.get(r.uid)
            if row is None:
                continue
            done = row.fault is not None or _feed(row, r.token, r.logprobs)
            if r.finish_reason is not None and row.fault is None:  # the generator dropped the row itself
                row.finish = row.finish or r.finish_reason
                del self.rows[r.uid]
                self.logprob_uids.pop(r.uid, None)
                published.append((r.all_tokens, r.prompt_cache, row))
                close_row(row)
            elif done or r.finish_reason is not None:
                ended.append(r.uid)
        ended += [uid for uid, row in self.rows.items() if row.fault is not None and uid not in ended]
        if ended:
            published += self._remove(ended)
        return published

    def _remove(self, uids: list[int]) -> Published:
        decoding = set(self.gen._generation_batch.uids)
        # Mid-prefill caches are not worth keeping, nor a failed row's.
        keep = [u for u in uids if u in decoding and self.rows[u].fault is None]
        caches = self.gen.remove(uids, return_prompt_caches=bool(keep))  # uids it dropped itself are skipped
        out: Published = []
        for uid in uids:
            row = self.rows.pop(uid)
            self.logprob_uids.pop(uid, None)
            if row.fault is not None:
                fail_faulty(row)
                self.faults += 1
                continue
            if uid in keep and uid in caches:
                cache, tokens = caches[uid]
                out.append((list(tokens), cache, row))
            else:
                out.append((None, None, row))
            close_row(row)
        return out

    def fail_all(self, message: str) -> None:
        uids = list(self.rows)
        if uids:
            self.gen.remove(uids)
        self.logprob_uids.clear()
        for uid in uids:
            self.rows.pop(uid).fail(message)
        held, self.joining = self.joining, []
        for row, *_ in held:
            row.fail(message)


@functools.cache
def _queue_layout_unknown() -> None:
    log.warning("mlx-lm's BatchGenerator queues are not the ones Hearth knows: prefill groups of 8, and a "
                "prefilled row starts decoding at once")


def lean_generation_batch(gen, logprob_uids: dict[int, int]) -> bool:
    """Give `gen` (mlx-lm's BatchGenerator) a decoding batch whose step leaves out the log-softmax
    over the vocabulary while every row is greedy and none asked for logprobs: the argmax of the
    logits is the argmax of the log-probabilities, and nothing else reads them then. mlx-lm
    normalizes every step (and slices the result into one array per row); over a vocabulary of
    151,936 that is two passes of `exp`-bound work a row a step, which on an x86 CPU (MLX's `exp`
    there is scalar code, see fastmath.py) took two thirds of a 32-row step of a small model.

    mlx-lm has no switch for it, so this is its `GenerationBatch._step` (0.32.2) with that
    change, and with greedy rows taking the argmax of the logits as they are (`sampling.sample`),
    put in place of the generator's empty decoding batch, which every prefilled row joins
    (`extend`); a row's first token still comes from mlx-lm's own step. Where mlx-lm's batch
    lacks what the copy relies on, the generator is left as it is. Answers whether it was changed."""
    from mlx_lm.generate import GenerationBatch

    batch = getattr(gen, "_generation_batch", None)
    needed = ("_next_tokens", "_next_logprobs", "_token_context", "fallback_sampler", "logits_processors")
    if type(batch) is not GenerationBatch or len(batch) or not all(hasattr(batch, a) for a in needed):
        log.warning("mlx-lm's BatchGenerator is not the one Hearth knows: every step keeps its log-softmax")
        return False
    lean = _lean_batch_class().empty(batch.model, batch.fallback_sampler)
    lean.logprob_uids = logprob_uids
    gen._generation_batch = lean
    return True


# Penalty windows up to this many tokens are applied to all the rows at once (`_penalize`): their tokens
# are gathered on the host each step. A longer window, or 0 (the whole history), runs row by row, and so
# do the penalties after it in that row's order.
BATCH_WINDOW = 256


def _batched(batch, logits, inputs):
    """Every row's logit bias, then its repetition, presence and frequency penalties (a row's first
    processors, `sampling.LogitBias` and `sampling.Penalty`), each kind for all the rows at once, and the
    processors left to run row by row. mlx-lm runs a row's processors on its own slice of the logits and
    concatenates the slices again. In-process on this CPU, 32 rows of a 2-layer model: with a bias on
    each (every runner of bench/device.py bans EOS so) 3,578-4,282 tok/s row by row, 4,176-5,163 at
    once, 5,423-5,976 with none; with the three penalties too, 1,924-2,235 row by row and 4,303-5,219
    a kind at a time. Biases and penalties are validated when the request comes (`checks`), so the one
    operation cannot fail for one row. The plan is kept until the batch's rows change."""
    import mlx.core as mx

    uids = tuple(batch.uids)
    plan = getattr(batch, "_processor_plan", None)
    if plan is None or plan[0] != uids:
        rows, cols, values, penalized, rest = [], [], [], [], []
        for e, processors in enumerate(batch.logits_processors):
            processors = list(processors or ())
            bias = getattr(processors[0], "bias", None) if processors else None
            if bias is not None:
                rows.append(mx.full(bias.ids.shape, e, dtype=mx.int32))
                cols.append(bias.ids)
                values.append(bias.values)
                processors = processors[1:]
            found = {}
            while processors and (p := getattr(processors[0], "penalty", None)) is not None \
                    and 0 < p.window <= BATCH_WINDOW:
                found[p.kind] = p
                processors = processors[1:]
            if found:
                penalized.append((e, found))
            rest.append(processors)
        at = (mx.concatenate(rows), mx.concatenate(cols), mx.concatenate(values)) if rows else None
        plan = batch._processor_plan = (uids, at, _penalty_plan(penalized, len(uids)), rest)
    _, at, penalties, rest = plan
    if at is not None:
        logits = logits.at[at[0], at[1]].add(at[2])
    if penalties is not None:
        logits = _penalize(batch, logits, inputs, penalties)
    return logits, rest


def _penalty_plan(penalized: list[tuple[int, dict]], size: int):
    """What `_penalize` needs that stays while the batch's rows do: the penalized rows, the widest
    window, and for each kind in mlx-lm's order its rows (indices into the penalized ones, and into the
    batch), windows and values. None when no row has a penalty to batch."""
    import mlx.core as mx
    import numpy as np

    if not penalized:
        return None
    every = len(penalized) == size  # then `penalized` is the batch's rows in order
    order = mx.arange(size) if every else mx.array([e for e, _ in penalized])
    stages = []
    for kind in Penalty.KINDS:
        mine = [i for i, (_, found) in enumerate(penalized) if kind in found]
        if mine:
            pick = None if len(mine) == len(penalized) else mx.array(mine)
            stages.append((kind, mine, pick, (order if pick is None else order[pick])[:, None],
                           np.array([penalized[i][1][kind].window for i in mine]),
                           [penalized[i][1][kind].value for i in mine]))
    width = max(p.window for _, found in penalized for p in found.values())
    return [e for e, _ in penalized], None if every else order, width, stages


def _penalize(batch, logits, inputs, plan):
    """The batched penalties (`_penalty_plan`) on the batch's logits, in mlx-lm's order and arithmetic,
    each kind one gather and scatter for its rows. A row's window is the last tokens of its context: what
    its KV cache holds (`batch.tokens`, on the host) and the token this step feeds (`inputs`, still on
    the device). A row whose context is shorter than the widest window pads its own with the step's
    token, which the scatter then writes with the same value as its real place."""
    import mlx.core as mx
    import numpy as np

    rows, order, width, stages = plan
    host = np.zeros((len(rows), width - 1), dtype=np.int32)
    known = np.empty(len(rows), dtype=np.int64)  # tokens of each row's window, the step's one included
    for i, e in enumerate(rows):
        held = batch.tokens[e][-(width - 1):] if width > 1 else []
        if held:
            host[i, width - 1 - len(held):] = held
        known[i] = len(held) + 1
    last = (inputs if order is None else inputs[order]).astype(mx.int32)[:, None]
    window = mx.concatenate([mx.array(host), last], axis=1) if width > 1 else last
    position = np.arange(width)
    for kind, mine, pick, at, windows, values in stages:
        span = np.minimum(windows, known[mine])
        inside = mx.array(position[None, :] >= (width - span)[:, None])
        tokens = window if pick is None else window[pick]
        tokens = mx.where(inside, tokens, tokens[:, -1:])
        value = mx.array(values, dtype=logits.dtype)[:, None]
        if kind == "frequency":  # once per time a token is in the window
            logits = logits.at[at, tokens].subtract(mx.where(inside, value, mx.zeros_like(value)))
            continue
        picked = logits[at, tokens]
        if kind == "presence":
            picked = picked - value
        else:
            picked = mx.where(picked < 0, picked * value, picked / value)
        logits[at, tokens] = picked
    return logits


class _StepLogprobs:
    """The logprob entries' numbers of a batched step's rows that asked for `k` top tokens (`sampling.top_logprobs`),
    computed with the step and read to the host once, when the first of them is handed out. A row's place
    in the batch's list of logprobs is (this, its index here), so mlx-lm's filter and extend of the list
    keep each with its row."""

    def __init__(self, logprobs, tokens, rows: list[int], k: int):
        import mlx.core as mx

        every = len(rows) == logprobs.shape[0]
        index = None if every else mx.array(rows)
        self.values = top_logprobs(logprobs if every else logprobs[index], tokens if every else tokens[index], k)
        self._host: list[TokenLogprobs] | None = None

    def read(self, i: int) -> TokenLogprobs:
        if self._host is None:
            chosen, ids, values = (a.tolist() for a in self.values)
            self._host = [TokenLogprobs(c, list(zip(r, v, strict=True)))
                          for c, r, v in zip(chosen, ids, values, strict=True)]
        return self._host[i]

    @staticmethod
    def place(logprobs, tokens, uids: list[int], asked: dict[int, int]) -> list:
        """A step's list of logprobs, a place a row: (group, index) for each row in `asked` (uid: how many
        top tokens), None for the others. One group a number of top tokens: each row's argpartition keeps
        its own k, so tied tokens are picked as they are for the row alone."""
        out: list = [None] * len(uids)
        if logprobs is None:
            return out
        by_top: dict[int, list[int]] = {}
        for e, uid in enumerate(uids):
            if uid in asked:
                by_top.setdefault(asked[uid], []).append(e)
        for k, rows in by_top.items():
            group = _StepLogprobs(logprobs, tokens, rows, k)
            for i, e in enumerate(rows):
                out[e] = (group, i)
        return out

    @staticmethod
    def resolve(place):
        """What a row's place in the list hands its row: its `TokenLogprobs`, or what mlx-lm's own step
        left there (an array, or None)."""
        return place[0].read(place[1]) if isinstance(place, tuple) else place

    @staticmethod
    def arrays(logprobs: list) -> list:
        """The arrays behind the entries in a batch's list of logprobs, each step's once."""
        steps = {id(lp[0]): lp[0] for lp in logprobs if isinstance(lp, tuple)}
        return [s.values for s in steps.values()]


@functools.cache
def _lean_batch_class():
    """Made once, on first use: mlx-lm is imported on the engine thread, not with this module."""
    from mlx_lm.generate import GenerationBatch

    class LeanGenerationBatch(GenerationBatch):
        logprob_uids: dict[int, int] = {}

        def _step(self: Any):  # typed loosely: mlx-lm's own attributes start as None
            import mlx.core as mx

            self._current_tokens = self._next_tokens
            self._current_logprobs = self._next_logprobs
            inputs = self._current_tokens
            logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
            token_context = []
            every = self.logits_processors
            if any(every):
                logits, every = _batched(self, logits, inputs)
            if any(every):
                processed = []
                for e in range(len(self.uids)):
                    sample_logits = logits[e:e + 1]
                    processors = every[e] or ()
                    if processors:
                        context = self._token_context[e].update_and_fetch(inputs[e:e + 1])
                        token_context.append(context)
                        for processor in processors:
                            sample_logits = processor(context, sample_logits)
                    processed.append(sample_logits)
                logits = mx.concatenate(processed, axis=0)
            samplers = [self.fallback_sampler if s is None else s for s in (self.samplers or [None] * len(self.uids))]
            # The changes: no log-softmax (nor its per-row slices) when nothing reads it, and greedy rows
            # take the argmax of the logits as they are (`sampling.sample`).
            logprobs = None
            if not all(greedy(s) for s in samplers) or any(u in self.logprob_uids for u in self.uids):
                logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            if all(s is samplers[0] for s in samplers):
                self._next_tokens = sample(samplers[0], logits, logprobs)
            else:
                self._next_tokens = mx.concatenate(
                    [sample(s, logits[e:e + 1], None if logprobs is None else logprobs[e:e + 1])
                     for e, s in enumerate(samplers)], axis=0)
            # And the logprob entries' numbers of every row that asked, in a few operations and one read
            # (`_StepLogprobs`), where mlx-lm hands each row its slice and `logprob_entry` reads it alone.
            self._next_logprobs = _StepLogprobs.place(logprobs, self._next_tokens, self.uids, self.logprob_uids)
            mx.async_eval(self._next_tokens, _StepLogprobs.arrays(self._next_logprobs), token_context)
            current = self._current_logprobs  # mlx-lm's own step (a new batch's first) leaves arrays
            mx.eval(inputs, [lp for lp in current if isinstance(lp, mx.array)], _StepLogprobs.arrays(current))
            tokens = inputs.tolist()
            for seen, token in zip(self.tokens, tokens, strict=True):
                seen.append(token)
            return tokens, [_StepLogprobs.resolve(lp) for lp in current]

    return LeanGenerationBatch


class SerialLane:
    name = "serial"

    def __init__(self, model: LoadedModel, kv_bits: int | None = None, kv_group: int = 64):
        self.model = model
        self.kv_bits = kv_bits
        self.kv_group = kv_group
        self.special = _special_ids(model)
        self.row: Row | None = None
        # generate_step is typed as yielding arrays; it yields (token id, logprobs).
        self._steps: Iterator[tuple[Any, Any]] | None = None
        self._cache: list | None = None
        self._tokens: list[int] = []

    @property
    def active(self) -> int:
        return 1 if self.row is not None else 0

    prefilling = 0

    def all_rows(self) -> list[Row]:
        row = self.row
        return [row] if row is not None else []

    def add(self, row: Row, cache: list | None, cached: int) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache

        prompt = row.context()
        processors = make_processors(row.req)
        if cached and processors:  # penalties look back over the whole prompt, cached part included
            prefix = mx.array(prompt[:cached])
            processors = [_with_prefix(p, prefix) for p in processors]
        if row.sampler is None:
            row.sampler = make_sampler(row.req, self.special)
        restart_row_state(row)
        self._cache = cache if cache is not None else make_prompt_cache(self.model.model)
        self._tokens = list(prompt)
        quant: dict[str, Any] = {}
        if self.kv_bits:
            quant = {"kv_bits": self.kv_bits, "kv_group_size": self.kv_group, "quantized_kv_start": 0}
        self._steps = generate_step(mx.array(prompt[cached:]), self.model.model, max_tokens=row.remaining,
                                    sampler=row.sampler, logits_processors=processors or None,
                                    prompt_cache=self._cache, **quant)
        self.row = row

    def step(self) -> Published:
        row = self.row
        if row is None:
            return []
        if not row.aborted:
            assert self._steps is not None  # set by add() together with the row
            try:
                token, logprobs = next(self._steps)
            except StopIteration:
                row.finish = row.finish or "length"
            else:
                self._tokens.append(token)
                if not _feed(row, token, logprobs):
                    return []
        if row.fault is not None:
            self._finish()
            fail_faulty(row)
            self.faults += 1
            return [(None, None, row)]
        # Once a token came out, the cache holds the prompt and every token handed out.
        published: Published = [(self._tokens, self._cache, row) if row.count else (None, None, row)]
        self._finish()
        close_row(row)
        return published

    def _finish(self) -> None:
        self.row, self._steps, self._cache, self._tokens = None, None, None, []

    faults = 0

    def take_faults(self) -> int:
        faults, self.faults = self.faults, 0
        return faults

    def fail_all(self, message: str) -> None:
        if self.row is not None:
            row = self.row
            self._finish()
            row.fail(message)


Lane = BatchLane | SerialLane


def _with_prefix(processor, prefix):
    import mlx.core as mx

    def run(tokens, logits):
        return processor(mx.concatenate([prefix, tokens]), logits)
    return run


# -- one row's failure stays its own -------------------------------------------
def guard_sampler(sampler, row: Row):
    """`sampler`, with an exception kept on the row and a stand-in token
    (never shown: the row ends first) so the batched step goes on."""
    def run(logprobs):
        import mlx.core as mx

        if row.fault is None:
            try:
                return sampler(logprobs)
            except Exception as exc:
                row.fault = exc
        return mx.argmax(logprobs, axis=-1)
    return run


def guard_processor(processor, row: Row):
    def run(tokens, logits):
        if row.fault is None:
            try:
                return processor(tokens, logits)
            except Exception as exc:
                row.fault = exc
        return logits
    run.bias = processor if isinstance(processor, LogitBias) else None  # type: ignore[attr-defined]
    run.penalty = processor if isinstance(processor, Penalty) else None  # type: ignore[attr-defined]
    return run


def _feed(row: Row, token: int, logprobs) -> bool:
    try:
        return row.feed(token, logprobs)
    except Exception as exc:  # its detokenizer, stop matching or logprobs entry
        row.fault = exc
        return True


def close_row(row: Row) -> None:
    """Send a finished row's last event; if even that fails, the row fails alone."""
    try:
        row.close()
    except Exception as exc:
        row.fault = exc
        fail_faulty(row)


def fault_message(exc: BaseException | None) -> str:
    if exc is None:
        return "generation failed"
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"generation failed: {first or type(exc).__name__}"


def fail_faulty(row: Row) -> None:
    log.warning("request %s failed on its own and was ended: %s", row.req.id, row.fault)
    row.fail(fault_message(row.fault))


def restart_row_state(row: Row) -> None:
    """A row continuing on a fresh lane gets a matcher (and a think bound) that
    has seen what it generated, and a seeded sampler back at the key for its next token (its
    grammar and key may have moved on in the failed step, even before its
    first token came out)."""
    if not row.restarts:
        return
    for stateful in (row.req.grammar, row.req.think):
        if stateful is not None:
            stateful.restart(row.generated)
    rewind = getattr(row.sampler, "rewind", None)  # a seeded sampler's
    if rewind is not None:
        rewind(row.count)


def suspect(row: Row, model: LoadedModel) -> bool:
    """True when this row's own sampling fails when run alone, eagerly, on
    neutral logits: the likely cause of a batched step that failed as a whole.
    A fresh sampler is used, so a seeded row's key is not advanced."""
    import mlx.core as mx

    try:
        logits = mx.zeros((1, model.vocab_size))
        tokens = mx.array(row.context()[-64:] or [0])
        for processor in make_processors(row.req):
            if not hasattr(processor, "restart"):  # a grammar matcher would take the probe as input
                logits = processor(tokens, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        mx.eval(make_sampler(row.req, _special_ids(model))(logprobs))
        return False
    except Exception as exc:
        row.fault = row.fault or exc
        return True
