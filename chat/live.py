"""A dashboard chat turn that outlives its socket.

A turn runs as a task of its own and writes its frames (`turn_start`,
deltas, tool cards, `turn_end`, …) to the session's resumable stream
(`runtime.streams`, keyed by the session id; each frame one SSE event).
Sockets only follow that stream: a socket that drops, a reloaded page or a
second tab attaches to it again and gets every frame from the first, then
the rest as they come. So a turn runs to its end, and is stored, whether or
not anyone watches; `abort` (or `DELETE /v1/stream/<session id>`) stops it.

A gated tool call waits for its approval while a socket can still answer
it; with no socket attached for `UNATTENDED_S`, it is denied. A `ui_*`
frame that asks the dashboard to act (`ask_browser`) waits for the first
socket's `ui_result`, a few seconds at most.

A message sent while a turn runs is queued on it (`queue_update` frames
show the queue): a *steering* message is taken at the next point the turn
can take one (after the current generation and its tool calls), a
*follow-up* once the turn has nothing left to do. Either way the answer so
far is stored, the message is stored as the next question, and the turn
goes on in a new *segment* of the same stream: `turn_end` with
`continues: true` and the stored reply, then `turn_start` with the new
question. A socket that attaches mid-turn reads the history up to the
current segment's anchor (the entry before it) and the stream from the
segment's first byte, so nothing is shown twice or missed. Stopping the
turn drops the queue and hands the dropped texts back (`dropped`).

With Redis a socket on another web node finds the turn too (`find`): a
`RemoteTurn` follows its stream from Redis and passes queued messages and
approvals to the node that runs it (`LiveTurn.remote_call`); the current
segment's anchor and offset are shared beside the stream."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async

from chat import store, window
from chat.models import ChatEntry, ChatSession
from core import sse
from core.surfaces import SOCKET
from serving.streams.shared import RemoteStream

log = logging.getLogger("hearth.chat")
UNATTENDED_S = 600.0
MAX_QUEUED = 16  # messages waiting on one turn


class TurnBusy(Exception):
    pass


class LiveTurn:
    """What the tool loop talks to while a turn runs: `send_json` writes a
    frame to the turn's stream; the runtime, the socket's coding permission
    and next-turn sampling are fixed when the turn starts."""

    def __init__(self, runtime, session: ChatSession, may_code: bool, next_sampling: dict, anchor_id: str):
        self.runtime, self.session, self.may_code = runtime, session, may_code
        self.session_id = session.id
        self.next_sampling = next_sampling
        self.approvals: dict[str, asyncio.Future] = {}  # gated tool calls waiting for the user
        self.ui_waits: dict[str, asyncio.Future] = {}  # ui frames waiting for the dashboard's answer
        self.stream = None  # its log.Stream
        self.produced = 0  # bytes written to the stream so far
        self.segment_offset = 0  # where the current segment's frames start in the stream
        self.anchor_id = anchor_id  # the stored entry the current segment follows
        self.steering: list[dict] = []  # queued messages: {"text", "images"}
        self.follow_ups: list[dict] = []
        self.closed = False  # past its last look at the queue: a new message starts a turn of its own
        self._frames: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._alone_since: float | None = None  # when the last socket stopped following

    async def send_json(self, frame: dict) -> None:
        data = sse.frame(json.dumps(frame, ensure_ascii=False, allow_nan=False))
        self.produced += len(data)  # the stream appends exactly these bytes, in this order
        self._frames.put_nowait(data)

    def queue_frame(self, dropped: list[str] | None = None) -> dict:
        frame = {"type": "queue_update", "steering": [m["text"] for m in self.steering],
                 "followUp": [m["text"] for m in self.follow_ups]}
        if dropped:
            frame["dropped"] = dropped
        return frame

    async def offer(self, text: str, images: list[str], behavior: str) -> bool:
        """Queue a message on the running turn; False once it takes no more
        (it is writing its last frames: the message starts the next turn)."""
        if self.closed:
            return False
        if len(self.steering) + len(self.follow_ups) >= MAX_QUEUED:
            raise TurnBusy(f"{MAX_QUEUED} messages are already waiting on this turn")
        (self.steering if behavior == "steer" else self.follow_ups).append({"text": text, "images": images})
        await self.send_json(self.queue_frame())
        return True

    async def answer(self, call_id: str, answer: dict) -> bool:
        """The user's answer to a gated tool call; False when none waits under that id."""
        future = self.approvals.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(answer)
        return True

    async def ask_browser(self, frame: dict, wait_s: float) -> dict | None:
        """Send `frame` with a new `callId` and wait up to `wait_s` for a
        dashboard's answer to it (`answer_ui`): None when none comes, and at
        once when no socket can answer (none follows the turn here, and no
        other web node shares the stream)."""
        call_id = f"ui_{secrets.token_hex(8)}"
        future = asyncio.get_running_loop().create_future()
        self.ui_waits[call_id] = future
        try:
            await self.send_json({**frame, "callId": call_id})
            shared = self.runtime is not None and self.runtime.streams.shared is not None
            if not shared and (self.stream is None or not self.stream.followers):
                return None
            return await asyncio.wait_for(future, wait_s)
        except asyncio.TimeoutError:
            return None
        finally:
            self.ui_waits.pop(call_id, None)

    async def answer_ui(self, call_id: str, answer: dict) -> bool:
        """A dashboard's answer to a ui frame; False when nothing waits for it
        (a frame replayed to a socket that attached later, a second tab)."""
        future = self.ui_waits.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(answer)
        return True

    async def remote_call(self, args: dict) -> dict:
        """What a socket on another web node asks of this turn (`RemoteTurn`)."""
        try:
            if args.get("what") == "offer":
                return {"queued": await self.offer(str(args["text"]), list(args["images"]), str(args["behavior"]))}
            if args.get("what") == "answer":
                return {"ok": await self.answer(str(args["callId"]), dict(args["answer"]))}
            if args.get("what") == "ui_result":
                return {"ok": await self.answer_ui(str(args["callId"]), dict(args["answer"]))}
        except TurnBusy as exc:
            return {"error": str(exc)}
        return {"error": f"unknown call {args.get('what')!r}"}

    def shared_state(self) -> dict:
        return {"segment_offset": self.segment_offset, "anchor_id": self.anchor_id}

    async def ended(self, wait_s: float = 10.0) -> None:
        """Wait for the stream of a closed turn to end (it is writing its last frames)."""
        if self.stream is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.stream.done.wait()), wait_s)

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
        return SOCKET.stream_error(message) + sse.frame(
            {"type": "turn_end", "sessionId": session_id, "aborted": True, "lane": None})
    return event


async def start(runtime, session: ChatSession, may_code: bool, next_sampling: dict, user_entry: ChatEntry
                ) -> LiveTurn:
    """Start a turn answering `user_entry` in `session`; raises TurnBusy while one runs there."""
    from serving.streams.store import StreamRefused

    if await find(runtime, session.id) is not None:
        raise TurnBusy("a turn is running in this chat; stop it first")
    turn = LiveTurn(runtime, session, may_code, next_sampling, user_entry.id)
    try:
        await runtime.streams.start(session.id, "chat", session.model, turn.frames(lambda t: run(t, user_entry)),
                                    turn.stop,
                                    error_event(session.id), context=turn)
    except StreamRefused as exc:
        raise TurnBusy(exc.message) from None
    turn.stream = runtime.streams.get(session.id)
    await runtime.streams.share(turn.stream, turn.shared_state())
    return turn


def live(runtime, session_id: str) -> LiveTurn | None:
    """The turn running in `session_id` on this node, if any."""
    stream = runtime.streams.get(session_id)
    if stream is None or not stream.live or not isinstance(stream.context, LiveTurn):
        return None
    return stream.context


class RemoteTurn:
    """A turn another web node runs (Redis): what a socket here does with a
    `LiveTurn`, passed on to that node."""

    def __init__(self, stream: RemoteStream, session_id: str):
        self.stream, self.session_id = stream, session_id
        self.segment_offset = int(stream.ctx.get("segment_offset") or 0)
        self.anchor_id = stream.ctx.get("anchor_id")

    async def _call(self, args: dict) -> dict:
        try:
            answer = await self.stream.call("call", args)
            if answer is None or answer.get("ended"):  # its node is gone, or the turn is over
                await self.stream.refresh()
                return {}
        except Exception as exc:  # Redis away
            raise TurnBusy(f"the web node that runs this turn cannot be reached: {exc}") from None
        if "error" in answer:
            raise TurnBusy(answer["error"])
        return answer

    async def offer(self, text: str, images: list[str], behavior: str) -> bool:
        answer = await self._call({"what": "offer", "text": text, "images": images, "behavior": behavior})
        return bool(answer.get("queued"))

    async def answer(self, call_id: str, answer: dict) -> bool:
        return bool((await self._call({"what": "answer", "callId": call_id, "answer": answer})).get("ok"))

    async def answer_ui(self, call_id: str, answer: dict) -> bool:
        return bool((await self._call({"what": "ui_result", "callId": call_id, "answer": answer})).get("ok"))

    async def ended(self, wait_s: float = 10.0) -> None:
        await self.stream.wait_ended(wait_s)


async def find(runtime, session_id: str) -> LiveTurn | RemoteTurn | None:
    """The turn running in `session_id` here or, with Redis, on another web node."""
    stream = await runtime.streams.find(session_id)
    if stream is None or not stream.live:
        return None
    if isinstance(stream.context, LiveTurn):
        return stream.context
    if isinstance(stream, RemoteStream) and stream.meta.kind == "chat":
        return RemoteTurn(stream, session_id)
    return None


async def follow(stream, session_id: str, offset: int = 0) -> AsyncIterator[dict]:
    """A turn's frames from its stream, from the first. A turn longer than
    the stream's cap has lost its first frames (and a reader that fell that
    far behind, some in the middle): it goes on from the first frame still
    kept, after a `turn_start` if the one that began it is gone. What was
    skipped only misses from the live view: `turn_end` brings the stored turn."""
    first = offset
    while True:
        if offset < stream.start:
            if offset == first:
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


def upto(pages: list[list[dict]], anchor_id: str) -> list[list[dict]]:
    """History pages cut after the running segment's anchor: what the turn
    stored since comes with the replay of its frames."""
    ids = [it.get("id") for page in pages for it in page]
    if anchor_id not in ids:
        return pages
    keep = len(ids) - ids[::-1].index(anchor_id)  # a long row comes in parts: keep them all
    out, seen = [], 0
    for page in pages:
        if seen < keep:
            out.append(page[:keep - seen])
        seen += len(page)
    return out


# -- the turn ----------------------------------------------------------------
async def run(turn: LiveTurn, user_entry: ChatEntry) -> None:
    """Answer `user_entry`, then each queued message in turn (see the module
    doc); `turn_end` without `continues` is always the last frame."""
    session = turn.session
    # The question as stored: a regenerated or edited turn tells every socket which branch it continues.
    first_row, = await sync_to_async(_rows)(user_entry)
    await turn.send_json({"type": "turn_start", "userEntryId": user_entry.id, "sessionId": session.id,
                          "user": first_row})
    meta: dict = {"aborted": True}
    try:
        while True:
            entry, meta, stopped = await _answer(turn, user_entry)
            if stopped:
                return
            try:
                question = await _next_question(turn, user_entry, entry)
            except Exception as exc:  # e.g. the session was deleted meanwhile
                log.warning("a queued message could not be stored: %s", exc)
                await turn.send_json(SOCKET.error(500, f"the queued message could not be stored: {exc}"))
                return
            if question is None:
                return
            answer, asked = question
            row, user_row = await sync_to_async(_rows)(answer, asked)
            await turn.send_json({"type": "turn_end", "lane": meta.get("lane"), "sessionId": session.id, **meta,
                                  "continues": True, "entry": row})
            turn.segment_offset, turn.anchor_id = turn.produced, answer.id
            await turn.runtime.streams.share(turn.stream, turn.shared_state())
            await turn.send_json({"type": "turn_start", "userEntryId": asked.id, "sessionId": session.id,
                                  "user": user_row})
            await turn.send_json(turn.queue_frame())
            user_entry = asked
    except asyncio.CancelledError:  # stopped between two answers
        meta = {**meta, "aborted": True}
    finally:
        turn.closed = True
        if turn.steering or turn.follow_ups:  # a stopped turn leaves nothing waiting: the texts go back
            dropped = [m["text"] for m in turn.steering + turn.follow_ups]
            turn.steering, turn.follow_ups = [], []
            await turn.send_json(turn.queue_frame(dropped))
        await turn.send_json({"type": "turn_end", "lane": meta.get("lane"), "sessionId": session.id, **meta})


def _rows(*entries: ChatEntry) -> list[dict]:
    return [store.entry_row(e) for e in entries]


# A conversation grown past the model's context (the model's own window, or the operator's cap).
TOO_LONG = ("context_length_exceeded", "context_over_budget", *window.SIZE_REFUSALS)
TOO_LONG_HINT = ("The chat leaves out the oldest turns that do not fit, but this message does not fit even alone "
                 "(with the system prompt and this turn's tool results): make it shorter.")


def _why(exc: Exception) -> str:
    """What a failed turn keeps where its answer would be. The protocols' refusal of a prompt too long
    asks its caller to shorten the prompt; here the prompt is the whole conversation, so the chat says how."""
    message = getattr(exc, "message", None) or str(exc)
    return f"{message} {TOO_LONG_HINT}" if getattr(exc, "code", None) in TOO_LONG else message


async def _answer(turn: LiveTurn, user_entry: ChatEntry) -> tuple[ChatEntry | None, dict, bool]:
    """Generate (with tool rounds) and store what was shown, a stopped
    answer's too: (the stored entry or None, its meta, whether it was stopped)."""
    from chat import toolloop

    session = turn.session
    started = time.perf_counter()
    state = toolloop.TurnState()
    stopped = False
    failed = ""  # why the turn could not go on, kept with it (the page shows it where the answer would be)
    try:
        conv = await sync_to_async(window.conversation)(session, user_entry)
        await toolloop.run(turn, session, conv, state)
    except asyncio.CancelledError:
        state.final, stopped = None, True
    except Exception as exc:  # RequestError, EngineError, TurnFailed
        state.final = None
        failed = _why(exc)
        await turn.send_json(SOCKET.error(400, failed))
    meta = _meta(state, started)
    if state.model:
        meta["model"] = state.model  # router mode: the model that answered
    entry = None
    try:
        # What was shown is kept, a stopped turn's included; a refused or failed turn keeps why, so the
        # question is not left unanswered with no word (regenerate or edit tries again).
        if state.text or state.reasoning or state.rounds or failed:
            stored = {**meta, "aborted": state.final is None, **({"error": failed} if failed else {})}
            if state.rounds:
                stored["toolRounds"] = state.rounds
            entry = await sync_to_async(store.add)(session, user_entry, "assistant", state.text,
                                                   state.reasoning, stored)
            await turn.send_json({"type": "siblings", **await sync_to_async(store.siblings)(entry)})
        await _send_context(turn, state.final)
    except Exception as exc:  # e.g. the session was deleted meanwhile
        log.warning("chat turn could not be stored: %s", exc)
        await turn.send_json(SOCKET.error(500, f"the reply could not be stored: {exc}"))
    meta["aborted"] = state.final is None
    return entry, meta, stopped


async def _next_question(turn: LiveTurn, user_entry: ChatEntry, answer: ChatEntry | None
                         ) -> tuple[ChatEntry, ChatEntry] | None:
    """The queued message to answer next, stored after the answer (an empty
    one when the turn showed nothing, so roles keep alternating): (answer,
    question); None, and the turn takes no more, when nothing waits."""
    if turn.steering:  # all the steering there is, as one message
        taken, turn.steering, source = turn.steering, [], "steering"
    elif turn.follow_ups:
        taken, source = [turn.follow_ups.pop(0)], "follow_ups"
    else:
        turn.closed = True  # no await since the look at the queue: nothing can slip in between
        return None
    text = "\n\n".join(m["text"] for m in taken)
    images = [url for m in taken for url in m["images"]]

    def store_both() -> tuple[ChatEntry, ChatEntry]:
        shown = answer or store.add(turn.session, user_entry, "assistant", "", meta={"aborted": False})
        return shown, store.add(turn.session, shown, "user", text, meta={"images": images} if images else None)
    try:
        return await sync_to_async(store_both)()
    except BaseException:  # not stored (or stopped meanwhile): back in the queue, so the end hands it back
        getattr(turn, source)[:0] = taken
        raise


async def _send_context(turn: LiveTurn, final) -> None:
    if final is None or final.usage is None:
        return
    from chat.toolloop import context_window

    window = context_window(turn.runtime, turn.session)  # the operator's cap where it is smaller
    used = final.usage.total_tokens
    await turn.send_json({"type": "context", "tokens": used, "contextWindow": window,
                          "percent": round(100 * used / window, 1) if window else None})


def model_info(runtime, model: str | None) -> dict:
    """Router mode: what `model`'s process said of itself when it loaded ({} before)."""
    from serving.router.slots import RouterError

    router = runtime.router
    try:
        slot = router.slots.get(router.resolve(model).id)
    except RouterError:
        return {}
    return slot.info if slot is not None else {}


def _meta(state, started: float) -> dict:
    """The turn's perf strip: time to its first token, and its decode rate: the tokens its generations decoded
    over the time they took (TurnState.generated), so tool runs, approvals, prefills and text held back from
    view count for nothing."""
    meta: dict = {}
    final = state.final
    if state.first is not None:
        meta["ttft_ms"] = round((state.first - started) * 1000)
    if final is not None and final.usage is not None:
        u = final.usage
        meta.update(lane=u.lane, prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                    cached_tokens=u.cached_tokens, finish_reason=final.finish_reason, tokens_per_s=None)
        if state.cut is not None:  # sent without the oldest turns: the page marks where the model's view begins
            meta["context_cut"] = state.cut
        if final.finish_reason == "length" and state.budget is not None:  # the chat's cap ended it: the page says so
            meta["reply_budget"] = state.budget
        if state.decode_s > 0 and state.decode_tokens > 0:
            meta.update(tokens_per_s=round(state.decode_tokens / state.decode_s, 2),
                        decode_tokens=state.decode_tokens, decode_ms=round(state.decode_s * 1000, 2))
    return meta
