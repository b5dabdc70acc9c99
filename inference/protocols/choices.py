"""`n` choices of one chat or completion request. Each choice is a row of
the batch: the rows are admitted together (their prompts prefill in one
batched step, and the prompt cache serves each as it would one request),
each with a grammar matcher and an output parser of its own and, with a
seed, the seed plus the choice's index. A stream merges the choices' chunks
as they come, each naming its `index`; the usage counts the prompt once
and the tokens of every choice."""
from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator

from inference.engine.types import EventStream, GenerationEvent, GenerationRequest, Usage
from inference.protocols.openai import Prepared
from inference.protocols.openai_reply import (
    KEEP_ALIVE,
    Ended,
    Message,
    Reply,
    choice_chunks,
    collect,
    sse,
    usage_json,
)
from inference.protocols.output import OutputParser

Run = tuple[EventStream, OutputParser | None]  # a choice's events and its parser


def requests(prepared: Prepared, compiler) -> list[tuple[GenerationRequest, OutputParser | None]]:
    """The request and output parser of every choice; the first is the prepared one."""
    constraint = prepared.constraint
    compiled = constraint.compiled if constraint is not None else None
    out = [(prepared.request, prepared.output)]
    for index in range(1, prepared.n):
        grammar = compiler.state(compiled) if compiled is not None else None
        out.append((prepared.request.sibling(index, grammar), copy.deepcopy(prepared.output)))
    return out


def joined(usages: list[Usage]) -> Usage:
    """One request's usage: its prompt once (with the most any choice read
    from the prompt cache), the completion tokens of every choice."""
    first = usages[0]
    return Usage(first.prompt_tokens, sum(u.completion_tokens for u in usages), max(u.cached_tokens for u in usages),
                 first.lane, timings=first.timings)


async def complete(reply: Reply, runs: list[Run]) -> tuple[dict | None, GenerationEvent | None]:
    """The answer with every choice, or (None, the failed choice's last event):
    the first choice to fail stops the others at once."""
    tasks = [asyncio.ensure_future(collect(events, output)) for events, output in runs]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                final = task.result()[2]  # a choice that raised raises here
                if final.error is not None:
                    return None, final
    finally:
        for task in tasks:  # the other rows stop when their event streams close
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    results: list[tuple[Message, list[dict], GenerationEvent]] = [task.result() for task in tasks]
    choices = [reply.choice(message, final.finish_reason, entries, index)
               for index, (message, entries, final) in enumerate(results)]
    return reply.answer(choices, joined([final.final_usage for _, _, final in results])), None


_END = object()  # a choice's stream is over


async def stream(reply: Reply, runs: list[Run], keepalive: float) -> AsyncIterator[bytes]:
    """The choices' chunks as they come; the usage rides on the last choice to
    finish (or comes apart, with `stream_options.include_usage`); an error in
    any choice ends the stream with its error event."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, events: EventStream, output: OutputParser | None) -> None:
        try:
            async for item in choice_chunks(reply, events, output, keepalive, index):
                await queue.put(item)
        except Exception as exc:  # handed to the stream, which raises it as a one-choice stream would
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(_END)

    tasks = [asyncio.ensure_future(pump(i, events, output)) for i, (events, output) in enumerate(runs)]
    usages: list[Usage] = []
    try:
        for _ in runs:
            while (item := await queue.get()) is not _END:
                if isinstance(item, Exception):
                    raise item
                if isinstance(item, bytes):
                    yield item
                    if item != KEEP_ALIVE:  # an error event: the stream ends here
                        return
                elif isinstance(item, Ended):
                    usages.append(item.usage)
                    if len(usages) < len(runs) or reply.usage_apart:
                        yield sse(item.chunk)
                    else:
                        yield sse({**item.chunk, "usage": usage_json(joined(usages))})
                else:
                    yield sse(item)
        if reply.usage_apart and usages:
            yield sse({**reply.chunk(), "choices": [], "usage": usage_json(joined(usages))})
        yield sse("[DONE]")
    finally:
        for task in tasks:  # a client that left, or a failed choice: the other choices' rows stop
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
