"""Anthropic Messages, the reply: the engine's events, split by the shared
OutputParser, become a Messages answer or Anthropic's content blocks and
stream events. Nothing here reads OpenAI wire output."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator

from core import sse
from core.surfaces import ANTHROPIC
from inference.engine.types import EventStream, GenerationEvent, Usage
from inference.protocols.argstream import finished_members
from inference.protocols.openai_reply import with_keepalive
from inference.protocols.output import Message, OutputParser, Piece, ToolDelta
from inference.protocols.toolcalls import ToolCall, called


def stop_reason(event: GenerationEvent, calls: list[ToolCall]) -> str:
    """`tool_use` only when the model stopped after calls it finished: a cut
    call leaves `max_tokens` or `stop_sequence` (which `stop_sequence` names)."""
    if event.finish_reason == "length":
        return "max_tokens"
    if called(calls):  # finished calls, a stop sequence after them or not (`stop_sequence` still names it)
        return "tool_use"
    return "stop_sequence" if event.stop_sequence else "end_turn"


def usage_json(usage: Usage, cached: int | None = None) -> dict:
    """Anthropic counts cache reads apart: input_tokens + cache_read_input_tokens
    is the prompt. `cached`: the cache reads a stream's message_start already
    reported (the final usage then agrees with it)."""
    cached = usage.cached_tokens if cached is None else cached
    out = {"input_tokens": usage.prompt_tokens - cached, "output_tokens": usage.completion_tokens}
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


def signature(model_id: str, thinking: str) -> str:
    """A thinking block's `signature`: opaque to clients, which send it back
    with the block; this server does not replay earlier thinking, so it only
    has to be stable for the same text."""
    return base64.b64encode(hashlib.sha256(f"{model_id}\0{thinking}".encode()).digest()).decode()


def _tool_block(call: ToolCall) -> dict:
    """A tool_use block; a cut call's input holds the members it wrote whole."""
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = finished_members(call.arguments)
    return {"type": "tool_use", "id": call.id.replace("call_", "toolu_", 1), "name": call.name,
            "input": args if isinstance(args, dict) else {"value": args}}


class Reply:
    def __init__(self, model_id: str, input_tokens: int):
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model_id, self.input_tokens = model_id, input_tokens
        self.cached = 0  # the cache reads message_start reported

    def complete(self, message: Message, event: GenerationEvent) -> dict:
        """The answer, its blocks in the order they were generated (as streamed)."""
        content: list[dict] = []
        for block in message.blocks:
            if isinstance(block, ToolCall):
                content.append(_tool_block(block))
            elif block.kind == "reasoning":
                content.append({"type": "thinking", "thinking": block.text,
                                "signature": signature(self.model_id, block.text)})
            else:
                content.append({"type": "text", "text": block.text})
        if not content:
            content.append({"type": "text", "text": ""})
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model_id, "content": content,
                "stop_reason": stop_reason(event, message.tool_calls), "stop_sequence": event.stop_sequence,
                "usage": usage_json(event.final_usage)}

    def start(self, cached: int = 0) -> dict:
        """message_start, with the prompt's cache reads as known now (once the
        request is admitted: `cached`); message_delta's usage repeats them."""
        self.cached = cached
        usage = {"input_tokens": self.input_tokens - cached, "output_tokens": 0}
        if cached:
            usage["cache_read_input_tokens"] = cached
        return {"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model_id, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage}}


async def _admitted(events: EventStream, cached) -> EventStream:
    """Wait until the request is admitted (`cached()` is not None), its first
    event came, or START_WAIT_S passed; answer the same events, none lost."""
    source = aiter(events)
    first = asyncio.ensure_future(anext(source))
    since = time.monotonic()
    try:
        while not first.done() and cached() is None and time.monotonic() - since < START_WAIT_S:
            await asyncio.wait({first}, timeout=ADMISSION_POLL_S)
    except BaseException:  # the client left while it waited
        first.cancel()
        with contextlib.suppress(BaseException):  # the generator runs until its fetch takes the cancellation
            await first
        await _close(source)
        raise

    async def chained():
        try:
            try:
                yield await first
            except StopAsyncIteration:
                return
            async for event in source:
                yield event
        finally:
            await _close(source)  # the engine's stream stops its row when closed early

    return chained()


async def _close(source) -> None:
    close = getattr(source, "aclose", None)
    if close is not None:
        await close()


def frame(event: dict) -> bytes:
    return sse.frame(event, event["type"])


PING = frame({"type": "ping"})
START_WAIT_S = 10.0  # a request queued longer gets its message_start (and pings) anyway
ADMISSION_POLL_S = 0.02


class _Blocks:
    """Opens and closes content blocks as the stream moves between channels."""

    def __init__(self, model_id: str):
        self.index, self.model_id, self.thinking = -1, model_id, ""
        self.open: str | None = None  # the kind of block open now

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # its signature closes a thinking block, as Anthropic sends it
            out.append(frame({"type": "content_block_delta", "index": self.index, "delta": {
                "type": "signature_delta", "signature": signature(self.model_id, self.thinking)}}))
        self.open, self.thinking = None, ""
        return out + [frame({"type": "content_block_stop", "index": self.index})]

    def text(self, piece: Piece) -> list[bytes]:
        kind = "thinking" if piece.kind == "reasoning" else "text"
        out = []
        if self.open != kind:
            out += self.close()
            self.index += 1
            self.open = kind
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            out.append(frame({"type": "content_block_start", "index": self.index, "content_block": block}))
        if kind == "thinking":
            self.thinking += piece.text
        delta = {"type": "thinking_delta", "thinking": piece.text} if kind == "thinking" else \
            {"type": "text_delta", "text": piece.text}
        out.append(frame({"type": "content_block_delta", "index": self.index, "delta": delta}))
        return out

    def tool(self, delta: ToolDelta) -> list[bytes]:
        """A tool_use block: started on a call's first delta, its input as
        input_json_delta pieces, stopped on its last."""
        out = []
        if delta.name is not None:
            out += self.close()
            self.index += 1
            self.open = "tool_use"
            out.append(frame({"type": "content_block_start", "index": self.index, "content_block": {
                "type": "tool_use", "id": delta.id.replace("call_", "toolu_", 1), "name": delta.name,
                "input": {}}}))
        partial = delta.arguments
        if partial and delta.name is not None and delta.done:  # a whole call: its input as one object
            partial = json.dumps(_tool_block(ToolCall(delta.name, delta.arguments, delta.id))["input"])
        if partial:
            out.append(frame({"type": "content_block_delta", "index": self.index,
                              "delta": {"type": "input_json_delta", "partial_json": partial}}))
        if delta.done:
            self.open = None
            out.append(frame({"type": "content_block_stop", "index": self.index}))
        return out


async def stream(reply: Reply, events: EventStream, output: OutputParser, keepalive: float,
                 cached=lambda: 0) -> AsyncIterator[bytes]:
    """Anthropic's event grammar: message_start, content blocks (text,
    thinking, tool_use) with their deltas, message_delta with the stop
    reason and usage, message_stop; `ping` while nothing else is sent; a
    failure is an `error` event. message_start waits until the request is
    admitted (`cached()` is not None: the prompt's cache reads are known) or
    an event comes, at most START_WAIT_S, so its usage is the final one."""
    events = await _admitted(events, cached)
    yield frame(reply.start(cached() or 0)) + PING
    blocks = _Blocks(reply.model_id)
    async for event in with_keepalive(events, output, keepalive, always=True):
        if event is None:
            yield PING
            continue
        if event.error is not None:
            yield ANTHROPIC.stream_error(event.error)
            return
        for item in output.ordered(event.text, event.finish_reason is not None, event.cut):
            if isinstance(item, ToolDelta):
                chunks = blocks.tool(item)
            else:
                chunks = blocks.text(item) if item.text else []
            if chunks:  # an event's frames in one write
                yield b"".join(chunks)
        if event.finish_reason is not None:
            yield b"".join([*blocks.close(),
                            frame({"type": "message_delta",
                                   "delta": {"stop_reason": stop_reason(event, output.calls),
                                             "stop_sequence": event.stop_sequence},
                                   "usage": usage_json(event.final_usage, reply.cached)}),
                            frame({"type": "message_stop"})])
            return
