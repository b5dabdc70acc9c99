"""Trace ids and where a generation's time went.

Every answer carries `X-Hearth-Trace-Id`: the one the request sent (letters,
digits and `._:-`, at most 128; anything else is a 400 naming the header),
or one made here. Router mode passes it on to the model's process, so both
processes' logs name the request alike.

Each generation request, when it ends, logs one line (`hearth.requests`)
with its trace id and its phases, in ms: `queue` (submitted to admitted by
the engine), `grammar_wait` (its grammar compiling, before submission),
`prefill` (admitted to the first token), `decode` (first to last token) and,
spent within decoding, `grammar` (the grammar's masks) and `detokenize`
(detokenizing and matching stop strings). `/stats` shows the recent
requests' phases as percentiles (`phases`).
"""
from __future__ import annotations

import logging
import re
import secrets
import threading
from collections import deque

from inference.engine.types import EventStream, GenerationEvent

HEADER = "X-Hearth-Trace-Id"
_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
PHASES = ("queue_ms", "grammar_wait_ms", "prefill_ms", "decode_ms", "grammar_ms", "detokenize_ms")
KEPT = 512  # the most recent generations /stats reads its percentiles from

log = logging.getLogger("hearth.requests")


class BadTraceId(ValueError):
    pass


def trace_id(sent: str | None) -> str:
    """The request's trace id: the one it sent, checked, or a new one."""
    if sent is None or not sent.strip():
        return secrets.token_hex(8)
    sent = sent.strip()
    if not _ID.fullmatch(sent):
        raise BadTraceId(f"{HEADER} must be 1 to 128 letters, digits or ._:- characters")
    return sent


class Phases:
    """The phases of the last KEPT generations, for /stats. Thread-safe."""

    def __init__(self):
        self._rows: deque[dict] = deque(maxlen=KEPT)
        self._lock = threading.Lock()

    def add(self, phases: dict) -> None:
        with self._lock:
            self._rows.append(phases)

    def stats(self) -> dict:
        with self._lock:
            rows = list(self._rows)
        body: dict = {"requests": len(rows)}
        for phase in PHASES:
            values = sorted(row.get(phase, 0.0) for row in rows)
            body[phase.removesuffix("_ms")] = {
                "p50_ms": _quantile(values, 0.5), "p95_ms": _quantile(values, 0.95),
                "mean_ms": round(sum(values) / len(values), 2) if values else None}
        return body


def _quantile(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


async def observed(request, prepared, events: EventStream) -> EventStream:
    """`events`, passed on; the last one's phases are logged and kept for
    /stats. Closing this closes `events` at once (a client that leaves stops
    its generation then, not when the garbage collector gets to it)."""
    try:
        async for event in events:
            if event.finish_reason is not None or event.error is not None:
                record(request, prepared, event)
            yield event
    finally:
        await events.aclose()


def record(request, prepared, final: GenerationEvent) -> None:
    usage = final.usage
    timings = usage.timings if usage is not None else None
    phases = {**dict.fromkeys(PHASES, 0.0), **(timings or {}),
              "grammar_wait_ms": round(prepared.grammar_wait_s * 1000, 2)}
    if timings is not None:  # a failed or stopped generation has none: it would drag the percentiles down
        request.runtime.phases.add(phases)
    counts = (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) if usage is not None else (0, 0, 0)
    log.info("trace=%s %s %s finish=%s prompt=%d cached=%d tokens=%d %s", getattr(request, "trace_id", "-"),
             request.method, request.path, final.finish_reason or "error", *counts,
             " ".join(f"{name}={phases[name]:g}" for name in PHASES))
