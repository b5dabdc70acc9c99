"""How a generation's events reach the event loop (inference/engine/rows.py):
one wake-up of each loop per engine step (`gathered`), and a reader that fell
behind gets the text queued meanwhile in one event, never a logprobs entry,
an error or the end merged away, and never out of order."""
from __future__ import annotations

import asyncio
import threading

from inference.engine.rows import Generation, Submission, gathered
from inference.engine.types import GenerationEvent, GenerationRequest, Usage


def _generation(loop) -> Generation:
    return Generation(GenerationRequest(prompt_tokens=[1, 2]), loop, asyncio.Queue())


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


def test_a_step_wakes_each_loop_once_and_keeps_the_order():
    async def run():
        loop = asyncio.get_running_loop()
        gens = [_generation(loop) for _ in range(3)]
        calls = []
        real = loop.call_soon_threadsafe

        def counted(*args):
            calls.append(args[0])
            return real(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]

        def engine_step():  # what the engine thread does in one step, for three rows
            with gathered():
                for n in range(2):
                    for i, gen in enumerate(gens):
                        gen.emit(GenerationEvent(text=f"{i}{n}", token_ids=(n,)))

        worker = threading.Thread(target=engine_step)
        worker.start()
        worker.join()
        await asyncio.sleep(0.05)
        return len(calls), [[gen.events.get_nowait().text for _ in range(2)] for gen in gens]

    wakeups, texts = asyncio.run(run())
    assert wakeups == 1 and texts == [["00", "01"], ["10", "11"], ["20", "21"]]
