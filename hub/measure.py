"""A decode-rate measurement of the served model, through the engine like
any request (so it queues behind and batches with real traffic)."""
from __future__ import annotations

import time

from inference.engine.types import GenerationRequest, LogitsParams


async def measure_decode(engine, tokens: int) -> tuple[float, int]:
    """(tokens per second after the first token, tokens generated)."""
    model = engine.loaded
    prompt = model.tokenizer.encode("Write a long story about the sea.")
    never_stop = {t: -100.0 for t in model.tokenizer.eos_token_ids}  # decode the full count (-100 bans)
    request = GenerationRequest(prompt_tokens=list(prompt), max_tokens=tokens,
                                logits=LogitsParams(logit_bias=never_stop), adapters=())
    stamps: list[float] = []
    async for event in engine.submit(request).events():
        if event.error is not None:
            raise RuntimeError(event.error)
        stamps.extend(time.perf_counter() for _ in event.token_ids)
    if len(stamps) < 2 or stamps[-1] <= stamps[0]:
        return 0.0, len(stamps)
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)
