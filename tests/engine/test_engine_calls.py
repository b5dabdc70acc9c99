"""Calls run on the engine thread between decode steps: a call that comes
in while another runs waits for the next step, so a caller that posts its
next call as each one returns (an embeddings request's turns) never holds
the streams beside it from one step to the next."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from inference.engine.types import GenerationRequest, LogitsParams


def test_a_call_that_comes_in_while_one_runs_waits_for_a_decode_step(local_engine, eos_id, monkeypatch):
    engine = local_engine
    steps, seen = [0], {}
    real_step = engine._step

    def step():
        steps[0] += 1
        real_step()

    monkeypatch.setattr(engine, "_step", step)

    def second():
        seen["second"] = steps[0]

    def first():
        seen["first"] = steps[0]
        caller = threading.Thread(target=engine.call, args=(second,))
        caller.start()
        deadline = time.monotonic() + 60
        while engine._inbox.qsize() == 0 and time.monotonic() < deadline:  # the next call is in before this returns
            time.sleep(0.001)
        seen["queued"] = engine._inbox.qsize()
        return caller

    async def main():
        request = GenerationRequest([1, 2, 3, 4], max_tokens=2000, logits=LogitsParams(logit_bias={eos_id: -100}))
        async with contextlib.aclosing(engine.submit(request).events()) as events:
            async for event in events:
                if event.token_ids:  # the row decodes: a step runs whenever the inbox lets one
                    break
            caller = await asyncio.to_thread(engine.call, first)
            await asyncio.to_thread(caller.join, 60)

    asyncio.run(main())
    assert seen["queued"] == 1 and "second" in seen
    assert seen["second"] > seen["first"], seen
