"""Anthropic Messages: the request becomes a chat turn on the shared path
(same template, tools, grammar, sampler and cache as chat completions); the
engine's events, split by the shared OutputParser, become Anthropic content
blocks and stream events. Nothing here reads OpenAI wire output."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator

from core import sse
from core.surfaces import ANTHROPIC
from inference.engine.types import EventStream, GenerationEvent, Usage
from inference.protocols.errors import RequestError
from inference.protocols.openai import Message, with_keepalive
from inference.protocols.output import OutputParser, Piece, ToolDelta
from inference.protocols.params import MAX_STOP_SEQUENCES, SAMPLING
from inference.protocols.toolcalls import ToolCall

AUDIO_BLOCKS = {"input_audio", "audio", "audio_url"}
# The chat-side fields Messages requests may carry besides their own (temperature, top_p and
# top_k are Messages fields too).
EXTRAS = (*(f for f in SAMPLING if f not in ("temperature", "top_p", "top_k")),
          "session_id", "prompt_cache_key", "response_format", "structured_outputs", "guided_grammar",
          "guided_regex", "guided_choice", "chat_template_kwargs", "adapter", "hlg")


# -- request ---------------------------------------------------------------
def _text_blocks(value, where: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a string or a list of text blocks", where)
    texts = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise RequestError(f"{where}[{i}] must be a text block", f"{where}[{i}]")
        texts.append(block["text"])
    return "\n\n".join(texts)


def _refuse_media(block: dict, where: str) -> None:
    kind = block.get("type")
    if not isinstance(kind, str):
        raise RequestError(f"{where}.type must be a string", where)
    if kind in AUDIO_BLOCKS:
        raise RequestError("the Messages protocol has no audio input; send audio to /v1/chat/completions "
                           "as an input_audio part", where)


def _image_part(block: dict, where: str) -> dict:
    """An `image` block as the chat part the shared path reads: a base64
    source becomes a data: URL, a url source stays a URL."""
    source = block.get("source")
    if not isinstance(source, dict):
        source = {}
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") if isinstance(source.get("media_type"), str) else "image/*"
        url = f"data:{media};base64,{source['data']}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise RequestError(f"{where}.source must be {{\"type\": \"base64\", \"media_type\": …, \"data\": …}} or "
                           "{\"type\": \"url\", \"url\": …}", where)
    return {"type": "image_url", "image_url": {"url": url}, "_at": where}


def _content(parts: list[dict]):
    """Text and image parts as message content: a string when there is no image."""
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _tool_result_content(block: dict, where: str):
    content = block.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of blocks", where)
    parts: list[dict] = []
    for i, part in enumerate(content):
        at = f"{where}.content[{i}]"
        if not isinstance(part, dict):
            raise RequestError(f"{at} must be a block", at)
        _refuse_media(part, at)
        if part.get("type") == "image":
            parts.append(_image_part(part, at))
            continue
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise RequestError(f"{at} must be a text or image block", at)
        parts.append({"type": "text", "text": ("\n" if parts else "") + part["text"]})
    return _content(parts)


def _messages(raw) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages required", "messages")
    out: list[dict] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise RequestError(f"{where}.role must be 'user', 'assistant' or 'system'", f"{where}.role")
        role, content = m["role"], m.get("content")
        if role == "system":  # agents (Claude Code) send these mid-conversation: a system turn in place
            out.append({"role": "system", "content": _text_blocks(content, f"{where}.content")})
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise RequestError(f"{where}.content must be a string or a list of content blocks", where)
        parts: list[dict] = []
        calls: list[dict] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            if not isinstance(block, dict):
                raise RequestError(f"{at} must be a content block", at)
            kind = block.get("type")
            _refuse_media(block, at)
            if kind == "text" and isinstance(block.get("text"), str):
                parts.append({"type": "text", "text": block["text"]})
            elif kind == "image" and role == "user":
                parts.append(_image_part(block, at))
            elif kind in ("thinking", "redacted_thinking"):
                continue  # earlier turns' thinking is not replayed
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    raise RequestError(f"{at} needs a name and an input object", at)
                calls.append({"id": str(block.get("id") or "toolu_" + uuid.uuid4().hex[:24]), "type": "function",
                              "function": {"name": block["name"],
                                           "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
            elif kind == "tool_result" and role == "user":
                if parts:  # keep the order the client wrote
                    out.append({"role": "user", "content": _content(parts)})
                    parts = []
                result = _tool_result_content(block, at)
                if block.get("is_error"):
                    result = [{"type": "text", "text": "Error: "}, *result] if isinstance(result, list) \
                        else "Error: " + result
                out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": result})
            else:
                raise RequestError(f"{at}: unsupported content block type {kind!r} in a {role} message", at)
        if role == "assistant":
            if parts or calls:
                msg: dict = {"role": "assistant", "content": _content(parts)}
                if calls:
                    msg["tool_calls"] = calls
                out.append(msg)
        elif parts:
            out.append({"role": "user", "content": _content(parts)})
    return out


def _tools(raw) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RequestError("tools must be a list", "tools")
    tools = []
    for tool in raw:  # server tools (web_search, …) have no input_schema: dropped
        if isinstance(tool, dict) and isinstance(tool.get("name"), str) and isinstance(tool.get("input_schema"), dict):
            function = {"name": tool["name"], "description": tool.get("description", ""),
                        "parameters": tool["input_schema"]}
            if isinstance(tool.get("strict"), bool):  # a strict tool's input is enforced (tool_choice.py)
                function["strict"] = tool["strict"]
            tools.append({"type": "function", "function": function})
    return tools or None


def _tool_choice(raw):
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(raw.get("name"), str):
        return {"type": "function", "function": {"name": raw["name"]}}
    raise RequestError("tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or "
                       "{\"type\": \"tool\", \"name\": …}", "tool_choice")


def to_chat_body(body: dict) -> dict:
    """The Messages request as the chat turn the shared path builds."""
    if "logit_bias" in body:
        raise RequestError("logit_bias is not part of the Messages protocol; use /v1/chat/completions",
                           "logit_bias")
    messages = _messages(body.get("messages"))
    if body.get("system") is not None:
        messages.insert(0, {"role": "system", "content": _text_blocks(body["system"], "system")})
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise RequestError("stop_sequences must be a list of strings", "stop_sequences")
    if stops and len(stops) > MAX_STOP_SEQUENCES:  # checked here so the message names this protocol's field
        raise RequestError(f"stop_sequences takes at most {MAX_STOP_SEQUENCES} sequences", "stop_sequences")
    chat: dict = {"messages": messages, "stream": body.get("stream", False)}
    for name in ("max_tokens", "temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if stops:
        chat["stop"] = stops
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"))
        if choice is not None:
            chat["tool_choice"] = choice
        if isinstance(body.get("tool_choice"), dict) and body["tool_choice"].get("disable_parallel_tool_use") is True:
            chat["parallel_tool_calls"] = False  # at most one tool_use block
    for name in EXTRAS:
        if name in body:
            chat[name] = body[name]
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") in
                                     ("enabled", "disabled", "adaptive")):
        raise RequestError("thinking must be {\"type\": \"enabled\" | \"disabled\" | \"adaptive\", …}", "thinking")
    if thinking is not None:
        kwargs = chat.get("chat_template_kwargs")
        chat["chat_template_kwargs"] = {**(kwargs if isinstance(kwargs, dict) else {}),
                                        "enable_thinking": thinking["type"] != "disabled"}
    return chat


def count_body(body: dict) -> dict:
    """count_tokens takes a Messages request without max_tokens (nor a tool
    choice or strict tools: counting compiles no grammar)."""
    chat = to_chat_body({k: v for k, v in body.items() if k not in ("stream", "max_tokens", "tool_choice")})
    for tool in chat.get("tools") or []:
        tool["function"].pop("strict", None)
    return chat


# -- response --------------------------------------------------------------
def stop_reason(event: GenerationEvent, calls: list) -> str:
    if calls and event.finish_reason == "stop":
        return "tool_use"
    if event.finish_reason == "length":
        return "max_tokens"
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


def _tool_block(call) -> dict:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": call.id.replace("call_", "toolu_", 1), "name": call.name,
            "input": args if isinstance(args, dict) else {"value": args}}


class Reply:
    def __init__(self, model_id: str, input_tokens: int):
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model_id, self.input_tokens = model_id, input_tokens
        self.cached = 0  # the cache reads message_start reported

    def complete(self, message: Message, event: GenerationEvent) -> dict:
        content: list[dict] = []
        if message.reasoning:
            content.append({"type": "thinking", "thinking": message.reasoning,
                            "signature": signature(self.model_id, message.reasoning)})
        if message.content or not (message.tool_calls or message.reasoning):
            content.append({"type": "text", "text": message.content})
        content += [_tool_block(c) for c in message.tool_calls]
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
    yield frame(reply.start(cached() or 0))
    yield PING
    blocks = _Blocks(reply.model_id)
    async for event in with_keepalive(events, output, keepalive, always=True):
        if event is None:
            yield PING
            continue
        if event.error is not None:
            yield ANTHROPIC.stream_error(event.error)
            return
        pieces = output.feed(event.text)
        if event.finish_reason is not None:
            pieces += output.finish()
        for piece in pieces:
            if piece.text:
                for chunk in blocks.text(piece):
                    yield chunk
        for delta in output.take_deltas():
            for chunk in blocks.tool(delta):
                yield chunk
        if event.finish_reason is not None:
            for chunk in blocks.close():
                yield chunk
            yield frame({"type": "message_delta",
                         "delta": {"stop_reason": stop_reason(event, output.calls),
                                   "stop_sequence": event.stop_sequence},
                         "usage": usage_json(event.final_usage, reply.cached)})
            yield frame({"type": "message_stop"})
            return
