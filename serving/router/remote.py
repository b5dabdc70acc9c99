"""A chat turn run by a model's process, for callers inside the router
(the dashboard's chat socket): the same `/v1/chat/completions` stream any
client gets, read back into reasoning and content deltas, whole tool
calls (put together from the stream's pieces) and the final usage."""
from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import httpx

from inference.engine.types import GenerationEvent, Usage
from serving.router.manager import Manager
from serving.router.owners import refused_hop
from serving.router.slots import RouterError, Slot


class RemoteFailed(RouterError):
    """The model's process refused the turn or stopped answering; `code` is
    the refusal's own where the process gave one (`context_length_exceeded`)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code:
            self.code = code


@dataclass(frozen=True)
class RemoteCall:
    id: str
    name: str
    arguments: str


@dataclass
class Delta:
    kind: str = ""  # "reasoning" | "content" | "" (nothing to show)
    text: str = ""
    calls: list[RemoteCall] = field(default_factory=list)
    final: GenerationEvent | None = None  # the last chunk: finish reason and usage


def _usage(body: dict) -> Usage:
    details = body.get("prompt_tokens_details") or {}
    timings = body.get("timings")
    return Usage(int(body.get("prompt_tokens") or 0), int(body.get("completion_tokens") or 0),
                 int(details.get("cached_tokens") or 0), str(body.get("lane") or "serial"),
                 timings=timings if isinstance(timings, dict) else None)


def _json_object(text: str) -> bool:
    """Whether a call's arguments are whole: a cut call's are the text as far as it was written
    (inference/protocols/output.py), never a JSON object."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _deltas(chunk: dict, calls: dict[int, list[str]]) -> list[Delta]:
    """What one chunk brings; tool-call pieces gather in `calls` (index ->
    [id, name, arguments]) and come out whole with the finish reason."""
    if isinstance(chunk.get("error"), dict):
        raise RemoteFailed(str(chunk["error"].get("message") or "the model's process failed"))
    out = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")  # this server sends `reasoning`
        if reasoning:
            out.append(Delta("reasoning", reasoning))
        if delta.get("content"):
            out.append(Delta("content", delta["content"]))
        for piece in delta.get("tool_calls") or []:
            function = piece.get("function") or {}
            call = calls.setdefault(int(piece.get("index") or 0), ["", "", ""])
            call[0] = piece.get("id") or call[0]
            call[1] = function.get("name") or call[1]
            call[2] += function.get("arguments") or ""
        if choice.get("finish_reason") and calls:
            whole = [RemoteCall(*calls[i]) for i in sorted(calls)]
            if choice["finish_reason"] != "tool_calls":  # cut short: a call it was cut off in is not run
                whole = [c for c in whole if _json_object(c.arguments)]
            out.append(Delta(calls=whole))
            calls.clear()
        if choice.get("finish_reason") and isinstance(chunk.get("usage"), dict):
            out.append(Delta(final=GenerationEvent(finish_reason=choice["finish_reason"],
                                                   usage=_usage(chunk["usage"]))))
    return out


async def chat(manager: Manager, model: str | None, body: dict) -> AsyncGenerator[Delta, None]:
    """Stream `body` (an OpenAI chat request) through `model`'s process
    (another web node's, when that node serves it; if it is gone, here)."""
    slot = await manager.acquire(model)
    if slot.remote is not None and slot.remote.node is not None:
        try:
            async with contextlib.aclosing(_chat(manager, slot, body)) as deltas:
                async for delta in deltas:
                    yield delta
            return
        except _PeerGone:  # raised before its first delta
            slot = await manager.take_over(model, slot)
    async with contextlib.aclosing(_chat(manager, slot, body)) as deltas:
        async for delta in deltas:
            yield delta


class _PeerGone(Exception):
    """Another web node did not take the turn (gone, draining, or it refused the hop's key)."""


async def _chat(manager: Manager, slot: Slot, body: dict) -> AsyncGenerator[Delta, None]:
    peer = slot.remote is not None and slot.remote.node is not None
    try:
        request = {**body, "model": slot.id, "stream": True}
        calls: dict[int, list[str]] = {}
        async with manager.client().stream("POST", slot.url + "/v1/chat/completions", json=request,
                                           headers=manager.hop_headers(slot)) as reply:
            if peer and refused_hop(reply):  # draining, or another hop key: served here
                raise _PeerGone()
            if reply.status_code != 200:
                raw = await reply.aread()
                code = None
                try:
                    error = json.loads(raw)["error"]
                    message, code = error["message"], error.get("code")
                except (ValueError, KeyError, TypeError, AttributeError):
                    message = raw.decode(errors="replace")[:500] or f"HTTP {reply.status_code}"
                raise RemoteFailed(message, code if isinstance(code, str) else None)
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    return
                for delta in _deltas(json.loads(payload), calls):
                    yield delta
    except httpx.HTTPError as exc:
        if peer and isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            raise _PeerGone() from exc
        raise RemoteFailed(f"model {slot.id!r} stopped answering ({type(exc).__name__}); it is loaded again on "
                           f"the next turn") from None
    finally:
        manager.release(slot)
