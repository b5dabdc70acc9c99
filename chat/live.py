"""A dashboard chat turn that outlives its socket.

A turn runs as a task of its own and writes its frames (`turn_start`,
deltas, tool cards, `turn_end`, …) to the session's resumable stream
(`runtime.streams`, keyed by the session id; each frame one SSE event).
Sockets only follow that stream: a socket that drops, a reloaded page or a
second tab attaches to it again and gets every frame from the first, then
the rest as they come. So a turn runs to its end, and is stored, whether or
not anyone watches; `abort` (or `DELETE /v1/stream/<session id>`) stops it.

A gated tool call waits for its approval while a socket can still answer
it; with no socket attached for `UNATTENDED_S`, it is denied."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async

from chat import store
from chat.models import ChatEntry, ChatSession
from core import sse

log = logging.getLogger("hearth.chat")
UNATTENDED_S = 600.0


class TurnBusy(Exception):
    pass


class LiveTurn:
    """What the tool loop talks to while a turn runs: `send_json` writes a
    frame to the turn's stream; the runtime, the socket's coding permission
    and next-turn sampling are fixed when the turn starts."""

    def __init__(self, runtime, session: ChatSession, may_code: bool, next_sampling: dict):
        self.runtime, self.session, self.may_code = runtime, session, may_code
        self.next_sampling = next_sampling
        self.approvals: dict[str, asyncio.Future] = {}  # gated tool calls waiting for the user
        self.stored_id: str | None = None  # the assistant entry the turn stored, once it has
        self.stream = None  # its log.Stream
        self._frames: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._alone_since: float | None = None  # when the last socket stopped following

    async def send_json(self, frame: dict) -> None:
        self._frames.put_nowait(sse.frame(json.dumps(frame, ensure_ascii=False, allow_nan=False)))

    def unattended(self) -> bool:
        """Whether no socket has followed the turn for UNATTENDED_S."""
        stream = self.stream
        if stream is None or stream.followers:
            self._alone_since = None
            return False
        since = self._alone_since or time.monotonic()
        self._alone_since = since
        return time.monotonic() - since > UNATTENDED_S

    async def frames(self, run) -> AsyncIterator[bytes]:
        """The turn's frames as it runs `run(self)`; closing this stops it."""
        self._task = asyncio.ensure_future(self._run(run))
        try:
            while True:
                frame = await self._frames.get()
                if frame is None:
                    return
                yield frame
        finally:
            await self.stop()

    async def _run(self, run) -> None:
        try:
            await run(self)
        except Exception:  # the turn reports its own failures; a bug still ends the stream
            log.exception("chat turn failed")
        finally:
            self._frames.put_nowait(None)

    async def stop(self) -> None:
        await cancel(self._task)


async def cancel(task: asyncio.Task | None) -> None:
    """Cancel `task` and wait until it has wound down (its own cleanup run)."""
    if task is not None and not task.done():
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


def error_event(session_id: str):
    def event(message: str) -> bytes:
        return sse.frame({"type": "error", "message": message}) + sse.frame(
            {"type": "turn_end", "sessionId": session_id, "aborted": True, "lane": None})
    return event


async def start(runtime, session: ChatSession, may_code: bool, next_sampling: dict, run) -> LiveTurn:
    """Start a turn in `session`; raises TurnBusy while one runs there."""
    from inference.streams.store import StreamRefused

    if live(runtime, session.id) is not None:
        raise TurnBusy("a turn is running in this chat; stop it first")
    turn = LiveTurn(runtime, session, may_code, next_sampling)
    try:
        await runtime.streams.start(session.id, "chat", session.model, turn.frames(run), turn.stop,
                                    error_event(session.id), context=turn)
    except StreamRefused as exc:
        raise TurnBusy(exc.message) from None
    turn.stream = runtime.streams.get(session.id)
    return turn


def live(runtime, session_id: str) -> LiveTurn | None:
    """The turn running in `session_id`, if any."""
    stream = runtime.streams.get(session_id)
    if stream is None or not stream.live or not isinstance(stream.context, LiveTurn):
        return None
    return stream.context


async def follow(stream, session_id: str) -> AsyncIterator[dict]:
    """A turn's frames from its stream, from the first. A turn longer than
    the stream's cap has lost its first frames (and a reader that fell that
    far behind, some in the middle): it goes on from the first frame still
    kept, after a `turn_start` if the one that began it is gone. What was
    skipped only misses from the live view: `turn_end` brings the stored turn."""
    offset = 0
    while True:
        if offset < stream.start:
            if offset == 0:
                yield {"type": "turn_start", "sessionId": session_id, "resumed": True}
            offset = stream.start
        pending = b""
        async for chunk in stream.follow(offset):
            offset += len(chunk)
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                data = "\n".join(line[6:] for line in event.decode().split("\n") if line.startswith("data: "))
                if data:
                    yield json.loads(data)
        if offset - len(pending) >= stream.start:  # it ended (or can be read no further), not dropped under us
            return


def without_entry(items: list[dict], entry_id: str | None) -> list[dict]:
    """History items less the one a live turn stored meanwhile (its replay brings it)."""
    return [it for it in items if it.get("id") != entry_id] if entry_id else items




# -- the turn ----------------------------------------------------------------
async def run(turn: LiveTurn, user_entry: ChatEntry) -> None:
    """Answer `user_entry`: generate (with tool rounds), store what was
    shown (a stopped turn's too), then `turn_end`, always last."""
    from chat import toolloop

    session = turn.session
    started = time.perf_counter()
    await turn.send_json({"type": "turn_start", "userEntryId": user_entry.id, "sessionId": session.id})
    state = toolloop.TurnState()
    try:
        messages = await sync_to_async(messages_for)(session, user_entry)
        await toolloop.run(turn, session, messages, state)
    except asyncio.CancelledError:
        state.final = None
    except Exception as exc:  # RequestError, EngineError, TurnFailed
        state.final = None
        await turn.send_json({"type": "error", "message": getattr(exc, "message", None) or str(exc)})
    meta = _meta(state.final, started, state.first)
    if state.model:
        meta["model"] = state.model  # router mode: the model that answered
    try:
        if state.text or state.reasoning or state.rounds:  # what was shown is kept, a stopped turn included
            meta["aborted"] = state.final is None
            if state.rounds:
                meta["toolRounds"] = state.rounds
            entry = await sync_to_async(store.add)(session, user_entry, "assistant", state.text,
                                                   state.reasoning, meta)
            turn.stored_id = entry.id
            await turn.send_json({"type": "siblings", **await sync_to_async(store.siblings)(entry)})
        await _send_context(turn, state.final)
    except Exception as exc:  # e.g. the session was deleted meanwhile
        log.warning("chat turn could not be stored: %s", exc)
        await turn.send_json({"type": "error", "message": f"the reply could not be stored: {exc}"})
    finally:
        meta.pop("toolRounds", None)
        await turn.send_json({"type": "turn_end", "lane": meta.get("lane"), "sessionId": session.id, **meta})


async def _send_context(turn: LiveTurn, final) -> None:
    if final is None or final.usage is None:
        return
    runtime = turn.runtime
    if runtime.router is not None:
        window = model_info(runtime, turn.session.model).get("context_window")
    else:
        window = runtime.engine.loaded.context_window if runtime.engine else None
    used = final.usage.total_tokens
    await turn.send_json({"type": "context", "tokens": used, "contextWindow": window,
                          "percent": round(100 * used / window, 1) if window else None})


def messages_for(session: ChatSession, user_entry: ChatEntry) -> list[dict]:
    from chat.toolloop import replay

    out = [{"role": "system", "content": session.system_prompt}] if session.system_prompt else []
    for e in store.path(session, user_entry):
        out += replay(e) if e.role == "assistant" else [{"role": e.role, "content": store.user_content(e)}]
    return out


def model_info(runtime, model: str | None) -> dict:
    """Router mode: what `model`'s process said of itself when it loaded ({} before)."""
    from inference.router.slots import RouterError

    router = runtime.router
    try:
        slot = router.slots.get(router.resolve(model).id)
    except RouterError:
        return {}
    return slot.info if slot is not None else {}


def _meta(final, started: float, first: float | None) -> dict:
    meta: dict = {}
    if first is not None:
        meta["ttft_ms"] = round((first - started) * 1000)
    if final is not None and final.usage is not None:
        u = final.usage
        elapsed = time.perf_counter() - (first or started)
        meta.update(lane=u.lane, prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                    cached_tokens=u.cached_tokens, finish_reason=final.finish_reason,
                    tokens_per_s=round((u.completion_tokens - 1) / elapsed, 2) if elapsed > 0 and
                    u.completion_tokens > 1 else None)
    return meta
