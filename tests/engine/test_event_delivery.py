"""How a generation's events reach the event loop (inference/engine/rows.py):
at most one wake-up of each loop per engine step (`gathered`) and none while
its readers are busy; a reader that fell behind gets the text queued
meanwhile in one event, never a logprobs entry, an error or the end merged
away, and never out of order; with many streams read at once, each passes
text on at most every `pace()`."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from inference.engine import rows
from inference.engine.rows import Generation, Submission, gathered
from inference.engine.types import GenerationEvent, GenerationRequest, Usage


def _generation(loop) -> Generation:
    return Generation(GenerationRequest(prompt_tokens=[1, 2]), loop)


def test_a_reader_behind_the_engine_gets_the_queued_text_in_one_event():
    async def run():
        gen = _generation(asyncio.get_running_loop())
        for i, text in enumerate(["a", "b", "c"]):
            gen.events.put_nowait(GenerationEvent(text=text, token_ids=(i,)))
        gen.events.put_nowait(GenerationEvent(text="d", token_ids=(3,), logprobs={"logprob": -1.0}))
        gen.events.put_nowait(GenerationEvent(text="e", token_ids=(4,)))
        gen.events.put_nowait(GenerationEvent(text="f", token_ids=(5,), finish_reason="stop",
                                              usage=Usage(2, 6, 0, "batch")))
        return [(e.text, e.token_ids, e.logprobs is not None, e.finish_reason)
                async for e in Submission(gen).events()]

    assert asyncio.run(run()) == [("abc", (0, 1, 2), False, None), ("d", (3,), True, None),
                                  ("ef", (4, 5), False, "stop")]


def test_a_step_wakes_each_loop_once_for_its_waiting_readers_and_keeps_the_order():
    async def run(waiting: bool):
        loop = asyncio.get_running_loop()
        gens = [_generation(loop) for _ in range(3)]
        calls = []
        real = loop.call_soon_threadsafe

        def counted(*args):
            calls.append(args[0])
            return real(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        firsts = [asyncio.ensure_future(gen.events.get()) for gen in gens] if waiting else []
        await asyncio.sleep(0)  # the readers wait

        def engine_step():  # what the engine thread does in one step, for three rows
            with gathered():
                for n in range(2):
                    for i, gen in enumerate(gens):
                        gen.emit(GenerationEvent(text=f"{i}{n}", token_ids=(n,)))

        worker = threading.Thread(target=engine_step)
        worker.start()
        worker.join()
        got = [[(await first).text] for first in firsts] or [[] for _ in gens]
        await asyncio.sleep(0.05)
        return len(calls), [texts + [gen.events.get_nowait().text for _ in range(2 - len(texts))]
                            for texts, gen in zip(got, gens, strict=True)]

    expected = [["00", "01"], ["10", "11"], ["20", "21"]]
    assert asyncio.run(run(waiting=True)) == (1, expected)
    assert asyncio.run(run(waiting=False)) == (0, expected)  # nobody waits: the loop is not woken


def test_a_waiting_reader_is_never_left_waiting_for_an_event_the_engine_sent():
    """The engine thread puts events while the reader takes them, waits and is
    woken, as fast as both go: every event arrives, in order, and the reader
    never waits for one already sent (the test would time out)."""
    async def run():
        gen = _generation(asyncio.get_running_loop())
        total = 20000

        def engine():
            for n in range(total):
                if n % 100 == 0:
                    time.sleep(0.0005)  # now and then the reader catches up and waits
                with gathered():
                    gen.emit(GenerationEvent(text="", token_ids=(n,)))

        worker = threading.Thread(target=engine)
        worker.start()
        seen = [(await asyncio.wait_for(gen.events.get(), 5)).token_ids[0] for _ in range(total)]
        worker.join()
        return seen

    assert asyncio.run(run()) == list(range(20000))


def test_a_reader_cancelled_while_waiting_leaves_no_waiter_behind():
    async def run():
        gen = _generation(asyncio.get_running_loop())
        waiting = asyncio.ensure_future(gen.events.get())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return gen.events.put(GenerationEvent(text="x"))  # answers a waiter to wake, or None

    assert asyncio.run(run()) is None


def test_many_streams_read_at_once_pass_text_on_a_few_tokens_at_a_time():
    async def run(streams: int, tokens: int):
        loop = asyncio.get_running_loop()
        gens = [_generation(loop) for _ in range(streams)]
        paces: list[float] = []

        async def engine():  # a token for every row each millisecond, then the end
            for n in range(tokens):
                await asyncio.sleep(0.001)
                paces.append(rows.pace())
                for gen in gens:
                    last = n == tokens - 1
                    gen.events.put_nowait(GenerationEvent(
                        text=f"{n},", token_ids=(n,), finish_reason="length" if last else None,
                        usage=Usage(2, tokens, 0, "batch") if last else None))

        async def read(gen):
            return [e.text async for e in Submission(gen).events()]

        reads = asyncio.gather(*(read(gen) for gen in gens))
        start = loop.time()
        await engine()
        return await reads, paces, loop.time() - start

    others = rows._reading  # generations another test of this process left open, if any
    tokens = 100
    events, paces, took = asyncio.run(run(40, tokens))
    assert max(paces) == pytest.approx(0.001 * (40 + others)) and rows._reading == others  # 40 ms apart
    whole = "".join(f"{n}," for n in range(tokens))
    for texts in events:
        assert "".join(texts) == whole  # nothing lost, nothing out of order
        assert len(texts) <= took / 0.04 + 2 and len(texts) < tokens  # at most one every 40 ms, not one a token
    assert asyncio.run(run(150, 3))[1][-1] == rows.PACE_MAX_S  # the cap
    assert asyncio.run(run(1, 3))[1][-1] == max(rows.PACE_MIN_S, 0.001 * (1 + others))  # one stream: the floor
    lone, _, took = asyncio.run(run(1, 60))  # a token a millisecond: 8 a chunk or so, the first text at once
    assert lone[0][0] == "0," and "".join(lone[0]) == "".join(f"{n}," for n in range(60))
    assert 2 <= len(lone[0]) <= took / rows.PACE_MIN_S + 2, lone
