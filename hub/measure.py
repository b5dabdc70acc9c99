"""A decode-rate measurement of the served model, through the engine like
any request (so it queues behind and batches with real traffic)."""
from __future__ import annotations

from inference.engine.types import GenerationRequest, LogitsParams


async def measure_decode(engine, tokens: int) -> tuple[float, int]:
    """(tokens per second after the first token, tokens generated)."""
    model = engine.loaded
    prompt = model.tokenizer.encode("Write a long story about the sea.")
    never_stop = {t: -100.0 for t in model.tokenizer.eos_token_ids}  # decode the full count (-100 bans)
    request = GenerationRequest(prompt_tokens=list(prompt), max_tokens=tokens,
                                logits=LogitsParams(logit_bias=never_stop), adapters=())
    count, decode_ms = 0, 0.0
    async for event in engine.submit(request).events():
        if event.error is not None:
            raise RuntimeError(event.error)
        count += len(event.token_ids)
        if event.usage is not None and event.usage.timings:
            decode_ms = event.usage.timings.get("decode_ms") or 0.0
    # The engine's own clock, first token to last: a stream's events may carry several tokens each
    # (`Submission.events` joins what queued and paces many streams), so their arrival times would not do.
    if count < 2 or decode_ms <= 0:
        return 0.0, count
    return (count - 1) / (decode_ms / 1000), count
