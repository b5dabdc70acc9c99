"""OpenAI chat and text completions, the reply: engine events in, wire
JSON out (a whole reply, or its SSE chunks). The request is read by
`openai.py`. Nothing here touches MLX."""
from __future__ import annotations

import asyncio
import codecs
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from core import sse as core_sse
from core.surfaces import OPENAI
from inference.engine.types import EventStream, GenerationEvent, Usage
from inference.protocols import (
    params,
)
from inference.protocols.errors import RequestError
from inference.protocols.output import Message, OutputParser, Piece, ToolDelta
from inference.protocols.toolcalls import ToolCall, called


def usage_json(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "lane": usage.lane,
        **({"timings": usage.timings} if usage.timings is not None else {}),
        **({"speculation": usage.speculation} if usage.speculation is not None else {}),
        **({"fill": usage.fill} if usage.fill is not None else {}),
    }


def finish_reason(finish: str | None, calls: list[ToolCall]) -> str | None:
    """`tool_calls` when the model stopped after calls it finished; a cut call leaves the finish as it was."""
    return "tool_calls" if called(calls) and finish == "stop" else finish


STREAM_OPTIONS = ("include_usage", "include_obfuscation")


def usage_apart(body: dict) -> bool:
    """`stream_options.include_usage`: the usage in a chunk of its own, with no
    choices, as OpenAI sends it (without it, the usage rides on the chunk with
    the finish reason). As on OpenAI, stream_options needs `stream: true`;
    `include_obfuscation` may only ask for none (no padding is sent)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    if not params.boolean(body, "stream"):
        raise RequestError("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                           "stream_options")
    for name in options:
        if name not in STREAM_OPTIONS:
            raise RequestError(f"stream_options.{name} is not a stream option (it takes "
                               f"{' and '.join(STREAM_OPTIONS)})", f"stream_options.{name}")
    if options.get("include_obfuscation") not in (None, False):
        raise RequestError("stream_options.include_obfuscation is not supported: no obfuscation padding is sent "
                           "here", "stream_options.include_obfuscation", code="unsupported_parameter")
    apart = options.get("include_usage", False)
    if not isinstance(apart, bool):
        raise RequestError("stream_options.include_usage must be a boolean", "stream_options.include_usage")
    return apart


class Reply:
    """Ids and timestamps shared by every chunk of one response."""

    def __init__(self, kind: str, model_id: str, body: dict | None = None):
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        self.kind, self.model_id = kind, model_id
        self.id, self.created = prefix + uuid.uuid4().hex[:24], int(time.time())
        self.usage_apart = usage_apart(body or {})
        self._text_at: dict[int, tuple[int, codecs.IncrementalDecoder]] = {}  # a completion choice's offset

    def _envelope(self, obj: str, *choices: dict) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_id,
                "choices": list(choices)}

    def logprobs_block(self, entries: list[dict], index: int = 0) -> dict | None:
        """The `logprobs` of a choice or chunk: chat's `{"content": [...]}`, or a
        completion's legacy columns (with the same `content` list beside them).
        `text_offset` counts the characters of the choice's text before each
        token, over the whole stream: a token's bytes decoded after those
        before it (a token holding part of a character adds nothing until the
        character is whole; a byte that cannot start one is the U+FFFD the text
        shows), not the length of its label (`bytes:\\x83`)."""
        if not entries:
            return None
        if self.kind == "chat":
            return {"content": entries, "refusal": None}
        at, decoder = self._text_at.get(index) or (0, codecs.getincrementaldecoder("utf-8")("replace"))
        offsets = []
        for entry in entries:
            offsets.append(at)
            at += len(decoder.decode(bytes(entry["bytes"])))
        self._text_at[index] = (at, decoder)
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets, "content": entries}

    def choice(self, message: Message, finish: str | None, logprobs: list[dict] | None = None,
               index: int = 0) -> dict:
        block = self.logprobs_block(logprobs or [], index)
        if self.kind != "chat":
            return {"index": index, "text": message.content, "logprobs": block, "finish_reason": finish}
        body: dict = {"role": "assistant",
                      "content": None if message.tool_calls and not message.content.strip() else message.content}
        if message.reasoning:
            body["reasoning"] = message.reasoning
        if message.tool_calls:
            body["tool_calls"] = [c.wire() for c in message.tool_calls]
        return {"index": index, "message": body, "logprobs": block,
                "finish_reason": finish_reason(finish, message.tool_calls)}

    def complete(self, message: Message, finish: str | None, usage: Usage,
                 logprobs: list[dict] | None = None) -> dict:
        return self.answer([self.choice(message, finish, logprobs)], usage)

    def answer(self, choices: list[dict], usage: Usage) -> dict:
        out = self._envelope("chat.completion" if self.kind == "chat" else "text_completion", *choices)
        out["usage"] = usage_json(usage)
        return out

    def chunk(self, delta: dict | None = None, finish: str | None = None, logprobs: list[dict] | None = None,
              index: int = 0) -> dict:
        block = self.logprobs_block(logprobs or [], index)
        if self.kind == "chat":
            choice = {"index": index, "delta": delta or {}, "logprobs": block, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", choice)
        text = (delta or {}).get("content", "")
        return self._envelope("text_completion", {"index": index, "text": text, "logprobs": block,
                                                  "finish_reason": finish})


sse = core_sse.frame
KEEP_ALIVE = core_sse.KEEP_ALIVE


async def collect(events: EventStream,
                  output: OutputParser | None) -> tuple[Message, list[dict], GenerationEvent]:
    """Drain a generation: the message split into channels, the logprobs
    entries (when asked) and the final event."""
    parts, entries = [], []
    async for event in events:
        parts.append(event.text)
        if event.logprobs is not None:
            entries.append(event.logprobs)
        if event.error is not None or event.finish_reason is not None:
            message = Message()
            if output is None:
                message.content = "".join(parts)
            else:
                message.take(output.ordered("".join(parts), finish=True, cut=event.cut), output.calls)
            return message, entries, event
    raise RuntimeError("generation ended without a final event")


def _call_deltas(deltas: list[ToolDelta]) -> list[dict]:
    """`tool_calls` entries, one per call in a chunk: id, type and name on a
    call's first, then pieces of its arguments."""
    out: list[dict] = []
    for delta in deltas:
        if out and out[-1]["index"] == delta.index:  # the same call again in this chunk: one entry
            out[-1]["function"]["arguments"] += delta.arguments
        elif delta.name is not None:
            out.append({"index": delta.index, "id": delta.id, "type": "function",
                        "function": {"name": delta.name, "arguments": delta.arguments}})
        elif delta.arguments:
            out.append({"index": delta.index, "function": {"arguments": delta.arguments}})
    return out


def _deltas(pieces: list[Piece]) -> list[dict]:
    return [{"reasoning" if p.kind == "reasoning" else "content": p.text} for p in pieces if p.text]


async def with_keepalive(events: EventStream, output: OutputParser | None,
                         interval: float, always: bool = False) -> AsyncIterator[GenerationEvent | None]:
    """Events, with None whenever `interval` passes while a tool call buffers
    (or, with `always`, whenever it passes without an event). Only a wait
    that can time out runs the next event's fetch as a task: the rest await
    it in place (a task and a wait per token cost the event loop more than
    the chunk they carry, with many streams on a fast device)."""
    pending: asyncio.Future | None = None
    try:
        while True:
            if always or (output is not None and output.buffering):
                if pending is None:
                    pending = asyncio.ensure_future(events.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=interval)
                if not done:
                    yield None
                    continue
            try:
                event = await pending if pending is not None else await events.__anext__()
            except StopAsyncIteration:
                return
            pending = None
            yield event
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):  # its own cancellation, or the stream's end
                await pending
        await events.aclose()


async def stream(reply: Reply, events: EventStream, output: OutputParser | None = None,
                 keepalive: float = 5.0) -> AsyncIterator[bytes]:
    """SSE frames: the role first (chat), reasoning and content deltas, tool
    calls (their arguments piece by piece as they are generated), a final
    chunk with the finish reason and usage, then [DONE]. A failure mid-stream is sent as an error frame and
    the stream closes. While a tool call buffers, `: keep-alive` comments
    keep client idle timers from firing."""
    async for item in choice_chunks(reply, events, output, keepalive):
        if isinstance(item, bytes):
            yield item
            continue
        if isinstance(item, Ended):  # the last frames in one write
            if reply.usage_apart:
                yield (sse(item.chunk) + sse({**reply.chunk(), "choices": [], "usage": usage_json(item.usage)})
                       + sse("[DONE]"))
            else:
                yield sse({**item.chunk, "usage": usage_json(item.usage)}) + sse("[DONE]")
            return
        yield sse(item)


@dataclass
class Ended:
    """A choice's last chunk (its finish reason) and the generation's usage."""

    chunk: dict
    usage: Usage


async def choice_chunks(reply: Reply, events: EventStream, output: OutputParser | None, keepalive: float,
                        index: int = 0) -> AsyncIterator[dict | bytes | Ended]:
    """One choice's stream: its chunks, `: keep-alive` comments (bytes) while
    a tool call buffers, then `Ended`, or an error event (bytes) and no more."""
    if reply.kind == "chat":
        yield reply.chunk({"role": "assistant", "content": ""}, index=index)
    entries: list[dict] = []  # logprobs not sent yet: each goes with the next chunk out (text held back waits)
    async for event in with_keepalive(events, output, keepalive):
        if event is None:
            yield KEEP_ALIVE
            continue
        if event.error is not None:
            yield OPENAI.stream_error(event.error)
            return
        if event.logprobs is not None:
            entries.append(event.logprobs)
        pieces = ([Piece("content", event.text)] if output is None else output.feed(event.text))
        if event.finish_reason is not None and output is not None:
            pieces += output.finish(cut=event.cut)
        for delta in _deltas(pieces):
            yield reply.chunk(delta, logprobs=entries, index=index)
            entries = []
        calls = _call_deltas(output.take_deltas()) if output is not None else []
        if calls:
            yield reply.chunk({"tool_calls": calls}, logprobs=entries, index=index)
            entries = []
        if event.finish_reason is not None:
            finish = finish_reason(event.finish_reason, output.calls if output else [])
            yield Ended(reply.chunk(finish=finish, logprobs=entries, index=index), event.final_usage)
            return
