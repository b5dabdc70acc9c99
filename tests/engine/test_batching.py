"""Continuous batching in the engine, in-process on the tiny model: every
row of a batch gets exactly what it would get alone, rows join and leave a
running batch, long prompts are prefilled in chunks, admission is bounded."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from inference.engine import lanes
from inference.engine.admission import MAX_QUEUED
from inference.engine.engine import Engine, EngineConfig
from inference.engine.errors import ContextOverBudget, QueueFull
from inference.engine.grammar import GrammarSpec
from inference.engine.types import GenerationRequest, LogitsParams, SamplingParams
from tests.helpers import collect


def _prompt(seed: int, length: int) -> list[int]:
    return [(seed * 31 + i * 7) % 250 + 3 for i in range(length)]


def _requests(engine: Engine, eos: int) -> list[GenerationRequest]:
    """Rows that differ in every per-row feature the batch must keep apart."""
    grammar = engine.loaded.grammar_compiler
    compiled = grammar.compile(GrammarSpec("regex", "[a-z]{3,12}!"))
    no_eos = {eos: -100.0}
    return [
        GenerationRequest(_prompt(1, 5), max_tokens=30, logits=LogitsParams(logit_bias=no_eos)),
        GenerationRequest(_prompt(2, 300), max_tokens=12),
        GenerationRequest(_prompt(3, 40), max_tokens=25, logprobs=True, top_logprobs=3),
        GenerationRequest(_prompt(4, 17), max_tokens=40, logits=LogitsParams(repetition_penalty=1.3,
                                                                             logit_bias=no_eos)),
        GenerationRequest(_prompt(5, 60), max_tokens=20, stop=["e", "a"]),
        GenerationRequest(_prompt(6, 9), max_tokens=30, grammar=grammar.state(compiled)),
        GenerationRequest(_prompt(7, 120), max_tokens=16,
                          sampling=SamplingParams(temperature=0.9, top_p=0.9, seed=11)),
        GenerationRequest(_prompt(8, 33), max_tokens=18, logits=LogitsParams(presence_penalty=0.5,
                                                                             frequency_penalty=0.3)),
    ]


@pytest.fixture(scope="module")
def alone(engines, eos_id) -> list[dict]:
    """What each of `_requests` gets served alone on the serial lane. Greedy or seeded, with no prompt
    cache, it is the same for every test that compares with it, so it is worked out once for the module."""
    serial = engines(batch=1, prompt_cache_bytes=0)
    return [asyncio.run(collect(serial, req)) for req in _requests(serial, eos_id)]


def _same(batched: dict, alone: dict) -> None:
    assert batched["tokens"] == alone["tokens"]
    assert batched["text"] == alone["text"]
    assert batched["finish"] == alone["finish"]
    assert len(batched["logprobs"]) == len(alone["logprobs"])
    for a, b in zip(batched["logprobs"], alone["logprobs"], strict=True):
        assert a["id"] == b["id"]
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)
        assert [t["id"] for t in a.get("top_logprobs", [])] == [t["id"] for t in b.get("top_logprobs", [])]


def test_every_batched_row_equals_the_request_served_alone(engines, eos_id, alone):
    batched_engine = engines(batch=8, prompt_cache_bytes=0)
    assert batched_engine.mode == "batch"

    async def together():
        return await asyncio.gather(*[collect(batched_engine, r) for r in _requests(batched_engine, eos_id)])

    batched = asyncio.run(together())
    for b, a in zip(batched, alone, strict=True):
        _same(b, a)
        assert b["usage"].lane == "batched" and a["usage"].lane == "serial"
    # the grammar row stopped on its own, with text the regex accepts
    assert alone[5]["finish"] == "stop" and alone[5]["text"].endswith("!")


def test_a_lone_request_decodes_in_plain_steps_as_the_serial_lane_would(engines, eos_id, alone):
    """Alone on a batch engine, each request decodes on the single-row path (pipelined plain steps,
    no BatchGenerator) and gets what the serial lane gives it: bias, logprobs, penalties, stop strings,
    a grammar, a seeded sampler."""
    engine = engines(batch=8, prompt_cache_bytes=0, jump_forward=False)
    for request, a in zip(_requests(engine, eos_id), alone, strict=True):
        out = asyncio.run(collect(engine, request))
        _same(out, a)
        assert out["usage"].lane == "serial"


def test_a_lone_row_moves_into_the_batch_with_its_token_in_flight(engines, eos_id, alone):
    """A second request moves the lone row into the batch mid-reply: the token its queued step sampled
    is handed out first, so no token is lost, repeated or drawn twice (a seeded row's key included)."""
    engine = engines(batch=8, prompt_cache_bytes=0, jump_forward=False)
    requests = _requests(engine, eos_id)

    async def joined(first: int, second: int):
        events = engine.submit(requests[first]).events()
        head = await events.__anext__()  # decoding alone now
        other = asyncio.create_task(collect(engine, requests[second]))
        rest = [event async for event in events]
        return head, rest, await other

    for first, second in ((0, 1), (2, 4), (3, 7), (6, 0)):  # bias, logprobs, penalties, seeded
        head, rest, other = asyncio.run(joined(first, second))
        tokens = list(head.token_ids) + [t for e in rest for t in e.token_ids]
        assert tokens == alone[first]["tokens"] and rest[-1].usage.lane == "batched"
        if first == 2:
            entries = [head.logprobs] + [e.logprobs for e in rest if e.logprobs is not None]
            assert [e["id"] for e in entries] == alone[2]["tokens"]
        _same(other, alone[second])


def test_a_row_that_ends_with_its_token_in_flight_is_published_with_the_next_step(engines, eos_id):
    """Driven step by step on the lane: a lone row whose queued token is its last ends while it moves,
    and the next step publishes it with a KV cache that holds exactly the tokens it is published for."""
    from inference.engine import lanes, speculate
    from inference.engine.rows import Generation, Row

    engine = engines(batch=8, prompt_cache_bytes=0, jump_forward=False)
    model = engine.loaded
    serial = asyncio.run(collect(engines(batch=1, prompt_cache_bytes=0), GenerationRequest(
        _prompt(1, 6), max_tokens=2, logits=LogitsParams(logit_bias={eos_id: -100.0}))))
    loop = asyncio.new_event_loop()

    def row(prompt: list[int], limit: int, stop: list[str] | None = None) -> Row:
        request = GenerationRequest(prompt, max_tokens=limit, logits=LogitsParams(logit_bias={eos_id: -100.0}),
                                    stop=stop or [])
        return Row(Generation(request, loop), model, limit, 0, "serial")

    def check(published, row):
        (tokens, cache, who), = [p for p in published if p[2] is row]
        assert tokens == row.context()[:len(tokens)] and cache[0].offset == len(tokens)
        return tokens

    try:
        lane = engine.call(lambda: speculate.Speculating(lanes.BatchLane(model, 8, 64), model, None,
                                                         speculate.SpecTotals()))
        a, b = row(_prompt(1, 6), 2), row(_prompt(2, 6), 4)
        assert engine.call(lambda: (lane.add(a, None, 0), lane.step(), lane.step())[1:]) == ([], [])
        assert a.count == 1 and lane._queued is not None  # its second and last token is in flight
        engine.call(lambda: lane.add(b, None, 0))  # a moves: its last token is handed out, and it ends
        assert a.count == 2 and a.finish == "length" and lane.active == 2
        published = engine.call(lane.step)
        assert check(published, a) == a.context()[:-1] and a.generated == serial["tokens"]
        while b.finish is None:
            published = engine.call(lane.step)
        check(published, b)
        c = row(_prompt(3, 6), 5)  # alone to its end: the last step queues nothing past the limit
        engine.call(lambda: lane.add(c, None, 0))
        while c.finish is None:
            published = engine.call(lane.step)
        assert c.count == 5 and check(published, c) == c.context()[:-1]
        first = model.tokenizer.decode(c.generated[:1])
        d = row(_prompt(3, 6), 5, stop=[first])  # ends on a stop string with the next step queued
        engine.call(lambda: lane.add(d, None, 0))
        while d.finish is None:
            published = engine.call(lane.step)
        assert d.count == 1 and d.stops.stopped and check(published, d) == d.context()
    finally:
        loop.close()


def test_a_prefilled_row_starts_decoding_with_the_group_being_prefilled(engines, eos_id):
    """A lone row prefilled alone, moved before its first token while a burst of short prompts is
    prefilled, waits that one step and starts decoding with them (one batch, not a batch the group is
    merged into a step later), and gets what it gets alone. Behind a prompt that takes several steps,
    it starts at once; one that leaves while it waits is published with the cache of its prompt."""
    from inference.engine import lanes, speculate
    from inference.engine.rows import Generation, Row

    engine = engines(batch=8, prompt_cache_bytes=0, jump_forward=False)
    model = engine.loaded
    bias = LogitsParams(logit_bias={eos_id: -100.0})
    serial = asyncio.run(collect(engines(batch=1, prompt_cache_bytes=0), GenerationRequest(
        _prompt(1, 6), max_tokens=6, logits=bias)))
    loop = asyncio.new_event_loop()

    def row(prompt: list[int], limit: int = 6) -> Row:
        return Row(Generation(GenerationRequest(prompt, max_tokens=limit, logits=bias), loop),
                   model, limit, 0, "serial")

    def prefilled_alone(lane, prompt):
        first = row(prompt)
        engine.call(lambda: (lane.add(first, None, 0), lane.step()))  # its prompt but the last token, in cache
        assert first.count == 0 and lane.row is first and lane._queued is None
        return first

    try:
        lane = engine.call(lambda: speculate.Speculating(lanes.BatchLane(model, 8, 64), model, None,
                                                         speculate.SpecTotals()))
        batch = lane.inner
        a = prefilled_alone(lane, _prompt(1, 6))
        group = [row(_prompt(seed, 20)) for seed in (2, 3, 4)]
        engine.call(lambda: [lane.add(r, None, 0) for r in group])  # `a` moves, and is held
        assert lane.row is None and [j[0] for j in batch.joining] == [a] and lane.active == 4
        engine.call(lane.step)  # the group's prompts are prefilled; `a` waits
        assert [j[0] for j in batch.joining] == [a] and batch.prefilling == 4
        engine.call(lane.step)  # all four start decoding, in one batch
        assert not batch.joining and len(batch.gen._generation_batch) == 4
        assert [r.count for r in (a, *group)] == [0, 0, 0, 0]
        engine.call(lane.step)
        assert [r.count for r in (a, *group)] == [1, 1, 1, 1]
        while a.finish is None:
            engine.call(lane.step)
        assert a.generated == serial["tokens"]
        while any(r.finish is None for r in group):
            engine.call(lane.step)

        b = prefilled_alone(lane, _prompt(1, 6))
        long = row(_prompt(5, 300))  # five steps of 64
        engine.call(lambda: lane.add(long, None, 0))
        engine.call(lane.step)
        assert not batch.joining
        engine.call(lane.step)
        assert b.count == 1 and long.count == 0  # decoding while the long prompt is prefilled
        engine.call(lambda: batch.fail_all("stop"))

        c = prefilled_alone(lane, _prompt(1, 6))
        engine.call(lambda: lane.add(row(_prompt(6, 20)), None, 0))
        c.generation.aborted.set()
        (tokens, cache, who), = [p for p in engine.call(lane.step) if p[2] is c]
        assert tokens == _prompt(1, 5) and cache[0].offset == 5
        engine.call(lambda: batch.fail_all("stop"))

        def error_of(r: Row) -> str | None:
            return loop.run_until_complete(asyncio.wait_for(r.generation.events.get(), 5)).error

        d = prefilled_alone(lane, _prompt(1, 6))
        engine.call(lambda: lane.add(row(_prompt(7, 20)), None, 0))
        engine.call(lambda: lane.fail_all("stopped"))  # a held row fails with the others
        assert not batch.joining and lane.active == 0 and error_of(d) == "stopped"

        e = prefilled_alone(lane, _prompt(1, 6))
        f = row(_prompt(8, 20))
        engine.call(lambda: lane.add(f, None, 0))
        insert = batch._insert

        def refuse_e(r, cache, cached):
            if r is e:
                raise RuntimeError("no room")
            return insert(r, cache, cached)

        batch._insert = refuse_e
        while f.count == 0:  # e fails alone when it goes in; f decodes on
            engine.call(lane.step)
        assert not batch.joining and "no room" in (error_of(e) or "") and f.fault is None
        engine.call(lambda: batch.fail_all("stop"))
    finally:
        loop.close()


def test_a_burst_of_short_prompts_is_prefilled_in_one_step_and_long_ones_eight_at_a_time(engines, eos_id):
    """A step prefills at least 8 prompts, and more while their chunks, padded to the longest, fit the
    tokens of 8 full chunks: 20 short prompts start decoding together; 12 long ones go 8, then 4."""
    from inference.engine import lanes
    from inference.engine.rows import Generation, Row

    engine = engines(batch=32, prompt_cache_bytes=0)
    model = engine.loaded
    loop = asyncio.new_event_loop()

    def row(prompt: list[int]) -> Row:
        request = GenerationRequest(prompt, max_tokens=3, logits=LogitsParams(logit_bias={eos_id: -100.0}))
        return Row(Generation(request, loop), model, 3, 0, "batched")

    def burst(length: int, n: int) -> list[int]:
        lane = engine.call(lambda: lanes.BatchLane(model, 32, 64))
        rows = [row(_prompt(seed, length)) for seed in range(n)]
        engine.call(lambda: [lane.add(r, None, 0) for r in rows])
        sizes = []
        while any(r.finish is None for r in rows):
            engine.call(lane.step)
            sizes.append(len(lane.gen._prompt_batch))
        return sizes

    try:
        assert burst(20, 20)[:2] == [20, 0]
        # 299 tokens in chunks of 64 take five steps: 8 rows, then the other 4 (the step that splits the 8
        # off, with only their last token to go, already prefills the 4)
        assert burst(300, 12)[:11] == [8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 0]
        lane = engine.call(lambda: lanes.BatchLane(model, 32, 64))
        lane.gen._currently_processing = [object()]  # an mlx-lm whose queues Hearth does not know
        assert engine.call(lane._plan_prefill) == (None, False)  # its own groups; held rows go in at once
    finally:
        loop.close()


def test_the_rows_biases_and_penalties_are_applied_a_kind_at_a_time(engines, eos_id):
    """A batched step applies every row's logit bias, then each kind of penalty, to all the rows at once
    (no per-row slice and concatenation when nothing else is left to run per row), windows longer than
    the context so far included; a penalty over the whole history still runs per row, after them. Each
    row gets what it gets alone, where mlx-lm's own processors run."""
    ban = {eos_id: -100.0}
    settings = [LogitsParams(logit_bias={eos_id: -100.0, 7: 3.0}),
                LogitsParams(logit_bias=ban, repetition_penalty=1.3),
                LogitsParams(logit_bias=ban, presence_penalty=3.0, presence_context_size=5),
                LogitsParams(logit_bias=ban, repetition_penalty=1.2, repetition_context_size=40,
                             frequency_penalty=0.5, frequency_context_size=3),
                LogitsParams(presence_penalty=-0.4, frequency_penalty=0.7, frequency_context_size=12),
                LogitsParams(logit_bias=ban, repetition_penalty=1.5, repetition_context_size=0)]  # all of it
    requests = [GenerationRequest(_prompt(i + 1, 5 + 2 * i), max_tokens=30, logits=lp)
                for i, lp in enumerate(settings)]
    serial = engines(batch=1, prompt_cache_bytes=0)
    alone = [asyncio.run(collect(serial, r)) for r in requests]
    unpenalized = [asyncio.run(collect(serial, replace(r, logits=LogitsParams(logit_bias=ban)))) for r in requests]
    assert all(alone[i]["tokens"] != unpenalized[i]["tokens"] for i in (1, 2, 3, 4, 5))  # each penalty tells
    engine = engines(batch=8, prompt_cache_bytes=0, jump_forward=False)

    async def together(reqs):
        return await asyncio.gather(*[collect(engine, r) for r in reqs])

    plans = []
    original = lanes._batched

    def watched(batch, logits, inputs):
        out = original(batch, logits, inputs)
        plans.append([len(p) for p in out[1]])
        return out

    lanes._batched = watched
    try:
        for got, want in zip(asyncio.run(together(requests[:5])), alone, strict=False):
            _same(got, want)
        assert plans and not any(any(p) for p in plans)  # nothing per row: one operation a kind a step
        plans.clear()
        for got, want in zip(asyncio.run(together(requests)), alone, strict=True):
            _same(got, want)
        assert any(1 in p for p in plans)  # the whole-history penalty still runs, per row
    finally:
        lanes._batched = original


def test_the_batched_penalties_equal_mlx_lms_own_row_by_row():
    """`lanes._batched` against each row's own processors (mlx-lm's) on its slice of the logits, exactly:
    repeated tokens, contexts shorter than their windows, rows with some kinds and not others, a row
    with none, and a whole-history window left to run per row."""
    import types

    import mlx.core as mx
    from mlx_lm.models.cache import TokenBuffer

    from inference.engine.sampling import LogitBias, Penalty, make_processors

    vocab, rows = 40, 7
    settings = [LogitsParams(repetition_penalty=1.4, presence_penalty=2.0, frequency_penalty=0.6),
                LogitsParams(logit_bias={3: -5.0}, presence_penalty=-1.5, presence_context_size=4),
                LogitsParams(frequency_penalty=0.9, frequency_context_size=30),
                LogitsParams(),
                LogitsParams(repetition_penalty=0.7, repetition_context_size=2, frequency_penalty=-0.3,
                             frequency_context_size=1),
                LogitsParams(repetition_penalty=1.3, repetition_context_size=0, presence_penalty=1.0),
                LogitsParams(logit_bias={5: 2.0}, presence_penalty=0.5, presence_context_size=256)]
    history = [[(i * 7 + j * j) % 11 for j in range(n)] for i, n in enumerate((25, 2, 0, 9, 40, 13, 300))]
    row = types.SimpleNamespace(fault=None)
    processors = [[lanes.guard_processor(p, row) for p in make_processors(GenerationRequest([1], logits=lp))]
                  for lp in settings]
    assert isinstance(processors[1][0].bias, LogitBias) and isinstance(processors[0][1].penalty, Penalty)
    logits = mx.random.normal((rows, vocab), key=mx.random.key(3)) * 3
    inputs = mx.array([3, 5, 7, 3, 11, 2, 5], dtype=mx.uint32)

    def check(keep: list[int]) -> list[int]:
        batch = types.SimpleNamespace(uids=keep, tokens=[history[e] for e in keep],
                                      logits_processors=[processors[e] for e in keep])
        got, rest = lanes._batched(batch, logits[mx.array(keep)], inputs[mx.array(keep)])
        for i, e in enumerate(keep):
            context = TokenBuffer(history[e]).update_and_fetch(inputs[e:e + 1])
            want = logits[e:e + 1]
            for p in processors[e][:len(processors[e]) - len(rest[i])]:
                want = p(context, want)
            assert mx.array_equal(got[i:i + 1], want).item(), e
        return [len(r) for r in rest]

    assert check(list(range(rows))) == [0, 0, 0, 0, 0, 2, 0]  # the whole-history row: both its penalties
    assert check([0, 1, 2, 4, 6]) == [0] * 5  # every row penalized


def test_a_batched_step_reads_its_rows_logprobs_at_once(engines, eos_id, monkeypatch):
    """The logprobs of the rows that asked (with top tokens or without, one of them sampled) are computed
    with the step and read to the host once for all of them, not row by row; only a row's first token,
    which mlx-lm's own first step of a new batch samples, comes the old way. Each row's entries are what
    it gets alone."""
    from inference.engine import rows
    from inference.engine.sampling import TokenLogprobs

    ban = LogitsParams(logit_bias={eos_id: -100.0})
    requests = [GenerationRequest(_prompt(1, 6), max_tokens=20, logits=ban, logprobs=True),
                GenerationRequest(_prompt(2, 11), max_tokens=20, logits=ban, top_logprobs=2),
                GenerationRequest(_prompt(3, 8), max_tokens=20, logits=ban, logprobs=True, top_logprobs=5),
                GenerationRequest(_prompt(4, 14), max_tokens=20, logits=ban),
                GenerationRequest(_prompt(5, 9), max_tokens=20, logits=ban, logprobs=True, top_logprobs=4,
                                  sampling=SamplingParams(temperature=0.8, seed=5))]
    serial = engines(batch=1, prompt_cache_bytes=0)
    alone = [asyncio.run(collect(serial, r)) for r in requests]
    read: dict[int, list[bool]] = {}  # by top_logprobs, which tells the rows apart: batched read or not
    entry = rows.logprob_entry

    def watched(tokenizer, token, logprobs, top):
        read.setdefault(top, []).append(isinstance(logprobs, TokenLogprobs))
        return entry(tokenizer, token, logprobs, top)

    monkeypatch.setattr(rows, "logprob_entry", watched)
    engine = engines(batch=8, prompt_cache_bytes=0, jump_forward=False)

    async def together():
        return await asyncio.gather(*[collect(engine, r) for r in requests])

    for got, want in zip(asyncio.run(together()), alone, strict=True):
        _same(got, want)
    assert sorted(read) == [0, 2, 4, 5] and all(len(seen) == 20 for seen in read.values())
    for seen in read.values():  # the old way only before the row's first batched step, then never again
        assert True in seen
        first = seen.index(True)
        assert all(seen[first:]) and first <= 10


def test_batched_logprob_entries_are_a_rows_own_even_where_tokens_tie(engines):
    """Rows asking for different numbers of top tokens in one step each get the entry `logprob_entry`
    makes from their own row, ties included (four tokens tie for second place here: which of them make a
    top 2 depends on the argpartition's k, so each number of top tokens is its own group)."""
    import mlx.core as mx

    from inference.engine.sampling import logprob_entry

    tokenizer = engines(batch=8).loaded.tokenizer
    tie = [-3.0, -1.0, -2.0, -2.0, -2.0, -5.0, -2.0, -4.0] + [-9.0] * 40
    logprobs = mx.array([tie, tie, tie, [float(-i) for i in range(48)]])
    tokens = mx.array([1, 3, 6, 0], dtype=mx.uint32)
    asked = {10: 2, 11: 5, 13: 0}  # uid: top tokens; uid 12 asked for none
    places = lanes._StepLogprobs.place(logprobs, tokens, [10, 11, 12, 13], asked)
    assert places[2] is None
    mx.eval(lanes._StepLogprobs.arrays(places))
    for e, top in ((0, 2), (1, 5), (3, 0)):
        token = tokens[e].item()
        assert logprob_entry(tokenizer, token, lanes._StepLogprobs.resolve(places[e]), top) == \
            logprob_entry(tokenizer, token, logprobs[e], top)


def test_a_greedy_batch_without_logprobs_skips_the_log_softmax(engines, eos_id, monkeypatch):
    """While every row is greedy and none asked for logprobs, a batched step samples the logits as they
    are (no log-softmax over the vocabulary); a row that asks for logprobs brings it back. Both give what
    the serial lane gives."""
    import mlx.core as mx

    calls = []
    real = mx.logsumexp

    def counted(*args, **kw):
        calls.append(args[0].shape)
        return real(*args, **kw)

    monkeypatch.setattr(mx, "logsumexp", counted)
    no_eos = LogitsParams(logit_bias={eos_id: -100.0})
    requests = [GenerationRequest(_prompt(i, 12), max_tokens=24, logits=no_eos) for i in range(4)]
    alone = [asyncio.run(collect(engines(batch=1, prompt_cache_bytes=0), r)) for r in requests]
    engine = engines(batch=4, prompt_cache_bytes=0)

    def together(batch):
        calls.clear()

        async def run():
            return await asyncio.gather(*[collect(engine, r) for r in batch])
        return asyncio.run(run())

    for out, a in zip(together(requests), alone, strict=True):
        _same(out, a)
    # Only mlx-lm's own first step of the rows prefilled together normalized; the 23 steps after did not.
    assert len([shape for shape in calls if shape[0] > 1]) <= 2
    logprobs = GenerationRequest(_prompt(9, 12), max_tokens=24, logits=no_eos, logprobs=True)
    out = together(requests[:3] + [logprobs])
    assert [o["tokens"] for o in out[:3]] == [a["tokens"] for a in alone[:3]] and len(out[3]["logprobs"]) == 24
    assert len([shape for shape in calls if shape[0] > 1]) >= 20


def test_the_engine_thread_runs_all_its_mlx_work_on_one_stream(engines):
    """mlx-lm's generation stream is the engine thread's default: a second stream would be a second CPU
    worker thread calling the BLAS (see Engine._run)."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    def streams():
        outer = mx.default_stream(mx.default_device())
        with mx.stream(generation_stream):
            return outer, mx.default_stream(mx.default_device())

    outer, inner = engines(batch=4, prompt_cache_bytes=0).call(streams)
    assert outer == inner


def test_rows_with_the_same_unseeded_settings_are_sampled_in_one_call(engines, eos_id, monkeypatch):
    from inference.engine import lanes

    widths: dict[str, list[int]] = {}  # the rows each sampler call took, by settings
    real = lanes.make_sampler

    def recording(req, special):
        sampler, name = real(req, special), f"t={req.sampling.temperature} seed={req.sampling.seed}"

        def run(logprobs):
            widths.setdefault(name, []).append(logprobs.shape[0])
            return sampler(logprobs)
        return run

    monkeypatch.setattr(lanes, "make_sampler", recording)
    engine = engines(batch=5, prompt_cache_bytes=0)
    no_eos = LogitsParams(logit_bias={eos_id: -100.0})

    def run(requests):
        async def together():
            return await asyncio.gather(*[collect(engine, r) for r in requests])
        widths.clear()
        return asyncio.run(together())

    alike = SamplingParams(temperature=0.7, top_k=5)
    out = run([GenerationRequest(_prompt(i, 10), max_tokens=20, logits=no_eos, sampling=alike) for i in range(4)])
    assert all(len(o["tokens"]) == 20 for o in out)
    assert max(widths["t=0.7 seed=None"]) == 4  # the four rows in one call

    seeded = SamplingParams(temperature=0.7, top_k=5, seed=3)
    run([GenerationRequest(_prompt(i, 10), max_tokens=20, logits=no_eos, sampling=s) for i, s in
         enumerate([alike, alike, seeded])])
    assert set(widths["t=0.7 seed=3"]) == {1}  # a seeded row draws from its own key, alone


def test_a_row_that_leaves_does_not_change_the_others(engines, eos_id, alone):
    engine = engines(batch=8, prompt_cache_bytes=0)

    async def together():
        reqs = _requests(engine, eos_id)
        runs = [collect(engine, r, abort_after=3 if i == 0 else None) for i, r in enumerate(reqs)]
        return await asyncio.gather(*runs)

    out = asyncio.run(together())
    # It left after its first event with 3 tokens or more (events carry several while 8 requests generate).
    assert 3 <= len(out[0]["tokens"]) < 30 and out[0]["finish"] is None
    for b, a in zip(out[1:], alone[1:], strict=True):
        _same(b, a)
    assert engine.active_rows == 0


def test_new_rows_join_a_running_batch_and_long_prompts_prefill_in_chunks(engines, eos_id):
    engine = engines(batch=4, prefill_chunk=32, prompt_cache_bytes=0)
    order: list[tuple[str, int]] = []

    async def follow(name, request):
        async for event in engine.submit(request).events():
            for _ in event.token_ids:  # one entry a token: an event may carry several (a paced stream)
                order.append((name, len(order)))

    async def scenario():
        long_run = asyncio.create_task(follow("a", GenerationRequest(
            _prompt(1, 8), max_tokens=300, logits=LogitsParams(logit_bias={eos_id: -100.0}))))
        while not any(name == "a" for name, _ in order):
            await asyncio.sleep(0.001)
        submitted_at.append(len(order))
        await follow("b", GenerationRequest(_prompt(2, 640), max_tokens=5))
        await long_run

    submitted_at: list[int] = []
    asyncio.run(scenario())
    names = [name for name, _ in order]
    first_b, last_a = names.index("b"), len(names) - 1 - names[::-1].index("a")
    assert first_b < last_a, "the second request waited for the first to finish"
    # While b's 640-token prompt was prefilled (20 chunks of 32), a kept decoding.
    a_during_prefill = names[submitted_at[0]:first_b].count("a")
    assert a_during_prefill >= 15


def test_seeded_sampling_does_not_depend_on_the_batch(engines, eos_id):
    req = lambda: GenerationRequest(_prompt(9, 25), max_tokens=24,  # noqa: E731
                                    sampling=SamplingParams(temperature=1.0, top_k=50, seed=1234))
    serial = engines(batch=1, prompt_cache_bytes=0)
    batched = engines(batch=8, prompt_cache_bytes=0)
    alone = asyncio.run(collect(serial, req()))

    async def crowd():
        noise = [collect(batched, GenerationRequest(_prompt(i, 30), max_tokens=20,
                                                 sampling=SamplingParams(temperature=1.0))) for i in range(5)]
        return await asyncio.gather(collect(batched, req()), *noise)

    assert asyncio.run(crowd())[0]["tokens"] == alone["tokens"]


def test_queue_admits_64_waiting_then_refuses(engines, eos_id):
    engine = engines(batch=1, prompt_cache_bytes=0)

    async def scenario():
        hold = engine.submit(GenerationRequest(_prompt(1, 4), max_tokens=2000,
                                               logits=LogitsParams(logit_bias={eos_id: -100.0})))
        events = hold.events()
        await events.__anext__()  # running: the one row is taken
        waiting = [engine.submit(GenerationRequest(_prompt(2, 4), max_tokens=1)) for _ in range(MAX_QUEUED)]
        assert engine.queued == MAX_QUEUED
        with pytest.raises(QueueFull) as refused:
            engine.submit(GenerationRequest(_prompt(3, 4), max_tokens=1))
        hold.abort()
        for sub in waiting:
            sub.abort()
        await events.aclose()
        return refused.value

    error = asyncio.run(scenario())
    assert (error.status, error.type, error.code) == (429, "resource_admission", "queue_full")


def test_context_cap_refuses_a_prompt_without_room_and_caps_one_that_fits(engines, eos_id):
    engine = engines(batch=2, max_context=64, prompt_cache_bytes=0)

    async def scenario():
        with pytest.raises(ContextOverBudget) as refused:
            engine.submit(GenerationRequest(_prompt(1, 64), max_tokens=5))
        fits = await collect(engine, GenerationRequest(_prompt(1, 50), max_tokens=1000,
                                                    logits=LogitsParams(logit_bias={eos_id: -100.0})))
        return refused.value, fits

    error, fits = asyncio.run(scenario())
    assert (error.status, error.type, error.code) == (400, "memory_admission", "context_over_budget")
    assert fits["finish"] == "length" and len(fits["tokens"]) == 14


def test_memory_budget_derives_the_context_cap(engines):
    model_bytes_probe = engines(batch=1, prompt_cache_bytes=0)
    loaded = model_bytes_probe.loaded
    budget = loaded.weights_bytes + (256 << 20) + 100 * loaded.kv_bytes_per_token
    engine = engines(batch=1, memory_budget=budget, prompt_cache_bytes=0)
    assert engine.enforced_context == 100


def test_quantized_kv_runs_on_the_serial_lane_and_reuses_its_cache(homes):
    from tests.helpers import build_tiny_model

    build_tiny_model(homes[0] / "hub", repo_id="hearth-test/tiny-kvq", heads=2)  # head_dim 32: quantizable
    engine = Engine("hearth-test/tiny-kvq", EngineConfig(batch=8, kv_quant=8))
    engine.start()
    try:
        assert engine.mode == "serial" and "quantized" in engine.serial_reason
        prompt = _prompt(4, 200)
        first = asyncio.run(collect(engine, GenerationRequest(prompt, max_tokens=10)))
        again = asyncio.run(collect(engine, GenerationRequest(prompt, max_tokens=10)))
        assert first["usage"].lane == "serial" and first["usage"].cached_tokens == 0
        assert again["usage"].cached_tokens == len(prompt) - 1
        assert again["tokens"] == first["tokens"]
        from mlx_lm.models.cache import QuantizedKVCache

        entry = next(iter(engine.cache.entries.values()))
        assert all(isinstance(c, QuantizedKVCache) for c in entry.cache)
    finally:
        engine.close(drain_seconds=1)


def test_kv_quant_refuses_a_head_dim_it_cannot_group(tiny_model):
    from inference.engine.errors import EngineError

    with pytest.raises(EngineError, match="head dimension divisible by 32"):
        Engine(tiny_model, EngineConfig(kv_quant=4)).start()


def test_waiting_clients_that_leave_free_their_queue_places(engines, eos_id):
    engine = engines(batch=1, prompt_cache_bytes=0)

    async def scenario():
        hold = engine.submit(GenerationRequest(_prompt(1, 4), max_tokens=2000,
                                               logits=LogitsParams(logit_bias={eos_id: -100.0})))
        events = hold.events()
        await events.__anext__()
        gone = [engine.submit(GenerationRequest(_prompt(2, 4), max_tokens=1)) for _ in range(MAX_QUEUED)]
        for sub in gone:
            sub.abort()  # their clients disconnected while waiting
        for _ in range(200):
            if engine.queued == 0:
                break
            await asyncio.sleep(0.01)
        queued_after = engine.queued
        late = engine.submit(GenerationRequest(_prompt(3, 4), max_tokens=1))  # no 429: the places are free
        hold.abort()
        await events.aclose()
        async for _ in late.events():
            pass
        return queued_after

    assert asyncio.run(scenario()) == 0


def test_flush_reports_entries_the_disk_cap_undid(tiny_model, tmp_path):
    engine = Engine(tiny_model, EngineConfig(batch=2, ssd_cache=str(tmp_path), ssd_cache_bytes=1))
    engine.start()
    try:
        asyncio.run(collect(engine, GenerationRequest(_prompt(5, 40), max_tokens=3)))
        durable, report = engine.flush_cache(30)
        assert not durable and report["notDurableEntries"] == 1 and report["entries"] == 0
    finally:
        engine.close(drain_seconds=1)
    engine = Engine(tiny_model, EngineConfig(batch=2, ssd_cache=str(tmp_path)))
    engine.start()
    try:
        asyncio.run(collect(engine, GenerationRequest(_prompt(5, 40), max_tokens=3)))
        durable, report = engine.flush_cache(30)
        assert durable and report["notDurableEntries"] == 0 and report["entries"] == 1
    finally:
        engine.close(drain_seconds=1)


class _Poison:
    """A logits processor that works for `after` steps, then fails: `eager`
    raises at once; otherwise it hands back an array that fails only when MLX
    evaluates it (an LU factorization of a zero matrix), so the batched step
    fails as a whole and the engine must find the culprit itself."""

    finished = False

    def __init__(self, after: int, eager: bool):
        self.calls, self.after, self.eager = 0, after, eager

    def __call__(self, tokens, logits):
        import mlx.core as mx

        self.calls += 1
        if self.calls <= self.after:
            return logits
        if self.eager:
            raise RuntimeError("poisoned processor")
        return logits + mx.linalg.inv(mx.zeros((2, 2)), stream=mx.cpu).sum()


async def _outcome(engine: Engine, request: GenerationRequest) -> dict:
    text, finish, error = "", None, None
    async for event in engine.submit(request).events():
        text += event.text
        finish, error = event.finish_reason or finish, event.error or error
    return {"text": text, "finish": finish, "error": error}


@pytest.mark.parametrize("eager", [True, False], ids=["raises", "fails-when-evaluated"])
def test_a_failing_row_ends_alone_and_its_neighbours_finish_intact(engines, eos_id, eager):
    engine = engines(batch=8, prompt_cache_bytes=0)
    no_eos = LogitsParams(logit_bias={eos_id: -100.0})
    healthy = [GenerationRequest(_prompt(1, 12), max_tokens=40, logits=no_eos),
               GenerationRequest(_prompt(2, 30), max_tokens=40, logits=no_eos,
                                 sampling=SamplingParams(temperature=1.0, top_k=40, seed=9))]
    alone = [asyncio.run(_outcome(engine, GenerationRequest(list(r.prompt_tokens), max_tokens=40, logits=no_eos,
                                                            sampling=r.sampling))) for r in healthy]
    failed_before = engine.stats.failed_rows

    async def together():
        poisoned = GenerationRequest(_prompt(3, 8), max_tokens=40, grammar=_Poison(5, eager))
        return await asyncio.gather(*(_outcome(engine, r) for r in [healthy[0], poisoned, healthy[1]]))

    first, bad, second = asyncio.run(together())
    assert bad["error"] and bad["error"].startswith("generation failed:"), bad
    assert first == alone[0] and first["finish"] == "length"
    assert second == alone[1] and second["finish"] == "length"
    assert engine.stats.failed_rows == failed_before + 1
    assert engine.active_rows == 0


@pytest.mark.parametrize("eager", [True, False], ids=["raises", "fails-when-evaluated"])
def test_a_lone_row_that_fails_ends_alone_and_the_engine_goes_on(engines, eos_id, eager):
    """On the single-row path too: a processor that raises fails its row; one whose array fails when
    evaluated fails the step, which the engine recovers (Engine._recover finds the row and ends it)."""
    engine = engines(batch=8, prompt_cache_bytes=0, jump_forward=False)
    no_eos = LogitsParams(logit_bias={eos_id: -100.0})
    rows_before, steps_before = engine.stats.failed_rows, engine.stats.failed_steps
    bad = asyncio.run(_outcome(engine, GenerationRequest(_prompt(3, 8), max_tokens=40, grammar=_Poison(5, eager))))
    assert bad["error"] and bad["error"].startswith("generation failed:"), bad
    assert engine.stats.failed_rows == rows_before + 1
    assert engine.stats.failed_steps == steps_before + (0 if eager else 1)
    after = asyncio.run(collect(engine, GenerationRequest(_prompt(1, 12), max_tokens=10, logits=no_eos)))
    assert len(after["tokens"]) == 10 and after["usage"].lane == "serial" and engine.active_rows == 0


@pytest.mark.parametrize("sampling,logits,param", [
    (SamplingParams(temperature=1.0, top_k=320), LogitsParams(), "top_k"),
    (SamplingParams(temperature=float("nan")), LogitsParams(), "temperature"),
    (SamplingParams(temperature=1.0, top_p=float("nan")), LogitsParams(), "top_p"),
    (SamplingParams(temperature=1.0, min_p=float("inf")), LogitsParams(), "min_p"),
    (SamplingParams(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.7), LogitsParams(), "xtc_threshold"),
    (SamplingParams(temperature=1.0, seed=-1), LogitsParams(), "seed"),
    (SamplingParams(temperature=1.0, seed=2**64), LogitsParams(), "seed"),
    (SamplingParams(), LogitsParams(logit_bias={i: float("-inf") for i in range(320)}), "logit_bias"),
    (SamplingParams(), LogitsParams(repetition_penalty=1.1, repetition_context_size=2**31), "repetition_context_size"),
    (SamplingParams(), LogitsParams(presence_penalty=float("nan")), "presence_penalty"),
])
def test_the_engine_refuses_what_its_samplers_cannot_run(engines, sampling, logits, param):
    from inference.engine.errors import InvalidRequest

    engine = engines(batch=8, prompt_cache_bytes=0)

    async def submit():
        engine.submit(GenerationRequest(_prompt(4, 6), max_tokens=4, sampling=sampling, logits=logits))

    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(submit())
    assert refused.value.param == param and refused.value.status == 400


def test_a_penalty_window_wider_than_the_context_means_the_whole_history(engines, eos_id):
    engine = engines(batch=8, prompt_cache_bytes=0)
    no_eos = {eos_id: -100.0}
    wide = GenerationRequest(_prompt(5, 10), max_tokens=12,
                             logits=LogitsParams(logit_bias=no_eos, repetition_penalty=1.5,
                                                 repetition_context_size=2**31 - 1))
    whole = GenerationRequest(_prompt(5, 10), max_tokens=12,
                              logits=LogitsParams(logit_bias=no_eos, repetition_penalty=1.5,
                                                  repetition_context_size=engine.loaded.context_window))
    assert asyncio.run(_outcome(engine, wide)) == asyncio.run(_outcome(engine, whole))


def test_neighbours_outlive_repeated_failures_of_others(engines, eos_id):
    """Two rows that each fail the whole step, one after the other: the
    healthy rows are restarted twice and still finish as they would alone."""
    engine = engines(batch=8, prompt_cache_bytes=0)
    no_eos = LogitsParams(logit_bias={eos_id: -100.0})
    healthy = GenerationRequest(_prompt(6, 20), max_tokens=40, logits=no_eos,
                                sampling=SamplingParams(temperature=1.0, top_k=40, seed=21))
    alone = asyncio.run(_outcome(engine, GenerationRequest(list(healthy.prompt_tokens), max_tokens=40, logits=no_eos,
                                                           sampling=healthy.sampling)))

    async def together():
        bad = [GenerationRequest(_prompt(7 + i, 8), max_tokens=40, grammar=_Poison(after, eager=False))
               for i, after in enumerate((4, 12))]
        return await asyncio.gather(*(_outcome(engine, r) for r in [healthy, *bad]))

    good, first, second = asyncio.run(together())
    assert first["error"] and second["error"]
    assert good == alone


def test_auto_batch_grows_with_the_requests_waiting(engines, eos_id):
    """Left to auto, the batch takes every waiting request (20 here, more
    than the old fixed 8), and each row still gets what it gets alone."""
    engine = engines(prompt_cache_bytes=0)
    assert engine.config.batch is None and engine.capacity == 64 and engine.mode == "batch"
    no_eos = LogitsParams(logit_bias={eos_id: -100.0})
    requests = [GenerationRequest(_prompt(40 + i, 6 + i), max_tokens=12, logits=no_eos) for i in range(20)]

    async def together():
        return await asyncio.gather(*(collect(engine, r) for r in requests))

    before = engine.stats.peak_rows
    results = asyncio.run(together())
    assert engine.stats.peak_rows == 20 > before or before >= 20
    alone = [asyncio.run(collect(engine, GenerationRequest(list(r.prompt_tokens), max_tokens=12, logits=no_eos)))
             for r in requests[:3]]
    assert [r["tokens"] for r in results[:3]] == [a["tokens"] for a in alone]
    assert all(len(r["tokens"]) == 12 for r in results)


def test_a_memory_budget_holds_the_batch_to_what_fits(engines, eos_id):
    """Room for the KV of three rows (each with GROWTH_TOKENS to grow): ten
    requests run three at a time, every one finishes, and the held ones are
    counted; none is refused."""
    from inference.engine.admission import GROWTH_TOKENS, TRANSIENT_RESERVE

    probe = engines(batch=1, prompt_cache_bytes=0).loaded
    per_row = 10 + 30 + GROWTH_TOKENS
    budget = probe.weights_bytes + TRANSIENT_RESERVE + (3 * per_row + 20) * probe.kv_bytes_per_token
    engine = engines(memory_budget=budget, prompt_cache_bytes=0)
    assert engine.kv_room == (3 * per_row + 20) * probe.kv_bytes_per_token
    no_eos = LogitsParams(logit_bias={eos_id: -100.0})
    requests = [GenerationRequest(_prompt(60 + i, 10), max_tokens=30, logits=no_eos) for i in range(10)]

    async def together():
        return await asyncio.gather(*(collect(engine, r) for r in requests))

    results = asyncio.run(together())
    assert all(r["finish"] == "length" and len(r["tokens"]) == 30 for r in results)
    assert engine.stats.peak_rows == 3
    assert engine.held_for_memory == 7
