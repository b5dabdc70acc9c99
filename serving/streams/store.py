"""Resumable streams: generations that outlive the request that started
them, replayable from any byte, kept on disk so a restart loses nothing.

A client opts in per request (`X-Conversation-Id` on a streaming POST; the
dashboard's chat turns always do). `Streams.start` runs the generation's
byte stream in a task of its own, so it ends whether or not anyone reads,
and appends every byte to the conversation's `Stream`; the HTTP reply, and
any later `GET /v1/stream/<id>?from=N`, only follow it. One live stream per
conversation: starting another stops the previous one.

On disk (HEARTH_HOME/streams, `disk.py`): each stream's bytes and record,
written behind it by one thread, at most `disk.FLUSH_S` later, never on the
event loop; the record is also written (by that thread) when the stream
begins, and its generation starts once it is on disk, so a stream is never
unknown after a crash. From its beginning a stream is its own task: a
reader that leaves, even before the record is written, leaves it running.
A stream still marked live whose process died is ended with its
`on_crash` event when the store opens. A stream
is kept `ttl_s` after it ends, each at most `cap` bytes, all of them at most
`total`: a new stream is refused while live ones hold so much that it could
not grow to `cap`, and as live streams grow, finished ones are dropped
oldest first to make room, then the growing stream's own oldest events
(`Stream.trim`: never what a connected reader has still to read, so the
total may run over by what readers are being sent, until they read it or
the HTTP guard cuts one that reads nothing).

With Redis (`shared.Shared`, set by the server when HEARTH_REDIS_URL is
set) every stream is also copied there as it is written, so another web
node finds it (`find`), replays and follows it, and stops it (the command
goes to the node that generates).

An identical retry (the same POST, path and body byte for byte, from the
same key, on the same conversation: `request_key`) of a stream that is
live or ended `done` follows that stream from its first byte instead of
starting the generation again (`replayable`): a client that lost its
connection and sends its request again costs nothing and gets the same
answer. A stream stopped, failed or cut short (its first bytes dropped)
is generated again; a stream whose generation failed ends with its
protocol's error event and is marked `failed` (in router mode too, where
the error comes from the model's process).

Router mode's model processes pass `record=False`: the router records, and
the model's process only keeps each conversation's generation so the
router can stop it (`DELETE /v1/stream/<id>` there).

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from core import holders, surfaces
from serving.streams.bounds import Bounds, StreamRefused
from serving.streams.disk import Owner, Writer, recover
from serving.streams.log import LIVE, Gone, Meta, Stream
from serving.streams.shared import RemoteStream, Shared

log = logging.getLogger("hearth.streams")

MAX_ID_CHARS = 256
ID = re.compile(r"[A-Za-z0-9._:-]{1,%d}" % MAX_ID_CHARS)  # a path segment as it is: no escaping, no `/`
MAX_LOOKUP = 1000
TAIL = 16 * 1024  # bytes of a stream's end kept while it runs: its last event is in them
CRASH_MESSAGE = ("the server stopped before this generation ended (it crashed, was killed or shut down); "
                 "what it generated until then is above")

StopFn = Callable[[], Awaitable[None]]


REPLAYABLE = (LIVE, "done")  # the states an identical retry follows rather than generating again


def request_key(path: str, body: bytes, holder: str) -> str:
    """What makes two POSTs identical retries of each other."""
    digest = hashlib.sha256()
    for part in (path.encode(), holder.encode(), body):
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


TAKEN = "this X-Conversation-Id is taken by another API key's stream; choose another"


def check_id(value: str, what: str = "X-Conversation-Id") -> str:
    if not ID.fullmatch(value):
        raise StreamRefused(f"{what} must be 1 to {MAX_ID_CHARS} letters, digits, '.', '_', ':' or '-' (a random "
                            "UUID is best: it is all that keeps others from reading the stream)", param=what)
    return value


class Streams(Bounds):
    def __init__(self, folder: Path | None, ttl_s: float = 300.0, cap: int = 4 << 20, total: int = 256 << 20,
                 record: bool = True):
        self.folder, self.ttl_s, self.cap, self.total, self.record = folder, ttl_s, cap, total, record
        self.by_id: dict[str, Stream] = {}  # conversation id -> its latest stream
        self.gone: list[Stream] = []  # replaced streams, deleted once nobody follows them
        self.relayed: dict[str, StopFn] = {}  # record=False: live generations, for their stop
        self._beginning: set[Stream] = set()  # streams whose record is on its way, their generation not begun
        self._claims: dict[str, asyncio.Lock] = {}  # one start or stop at a time per conversation
        self._overlaps: set[asyncio.Task] = set()  # stops of another node's stream begun at the same moment
        self.writer: Writer | None = None
        self.owner: Owner | None = None
        self._gc_task: asyncio.Task | None = None
        self.shared: Shared | None = None  # Redis: the streams of every web node
        self.replays = 0  # identical retries answered from a stream instead of generating again
        self._held = 0  # bytes all streams held when last counted, plus what was appended since (never less)

    # -- opening and closing ------------------------------------------------
    def open(self) -> None:
        """Take the folder: recover what earlier processes left, start the writer."""
        if not self.record or self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self.owner = Owner(self.folder)
        self.by_id.update(recover(self.folder, self.cap, self._expired))
        self._held = self._bytes()
        if self.by_id:
            log.info("resumable streams: %d kept from before this start", len(self.by_id))
        self.writer = Writer()
        self.writer.start()

    def shutdown(self) -> None:
        """End every live stream with its crash event and write everything out
        (the server is stopping: nothing will finish them)."""
        ended = []
        for stream in list(self.by_id.values()):
            if stream.live:
                stream.finish("interrupted", stream.meta.on_crash.encode())
                ended.append(stream)
                if stream.task is not None and stream not in self._beginning:  # one beginning stops itself
                    stream.task.cancel()
                self._dirty(stream)
        if self.shared is not None:
            self.shared.shutdown(ended)
        if self._gc_task is not None:
            self._gc_task.cancel()
        if self.writer is not None:
            self.writer.close()
        if self.owner is not None:
            self.owner.close()

    # -- starting and stopping ------------------------------------------------
    async def start(self, conversation_id: str, kind: str, model: str | None, producer: AsyncIterator[bytes],
                    stop: StopFn, error_event: Callable[[str], bytes],
                    context: object = None, failed: Callable[[], bool] | None = None,
                    holder: str = "", request: str = "") -> AsyncIterator[bytes]:
        """Run `producer` to its end whatever its reader does; answer what the
        request's reader gets (every byte, from the first). `stop` asks the
        generation to end early; `error_event(message)` is an event in the
        stream's protocol that ends it with an error. `context` is kept on the
        stream for its owner (the chat keeps its running turn there).
        `failed()`, asked when the producer ends, says it ended on an error
        event of its own (the stream then ends `failed`). The stream belongs
        to `holder` (core/holders.py): a conversation whose stream another
        key holds is refused (409), never stopped or replaced. `request` is
        the starting POST's `request_key` (for `replayable`)."""
        check_id(conversation_id)
        async with self._claim(conversation_id):  # two POSTs at once: the second stops the first
            if self.record and await self.taken(conversation_id, holder):
                raise StreamRefused(TAKEN, status=409, param="X-Conversation-Id")
            await self._stop(conversation_id)
            if not self.record:
                return self._relay_only(conversation_id, producer, stop)
            self._make_room()
            stream = self._begin(conversation_id, kind, model, stop, error_event, context, holder, request)
            stream.failed_fn = failed
            # Its own task from here: a reader that leaves while the record is written leaves it running.
            self._beginning.add(stream)
            stream.task = asyncio.ensure_future(self._run(stream, producer, error_event))
            return stream.follow(0)

    async def _run(self, stream: Stream, producer: AsyncIterator[bytes], error_event) -> None:
        """A begun stream's record on disk (and in Redis), before its first
        byte, then its generation to the end. A stream the shutdown ended
        meanwhile, or one that could not be shared, never starts its
        generation: it is asked to stop, as the engine still holds it."""
        try:
            await self._record(stream)
            if stream.live and self.shared is not None:
                await self.shared.run(self._command)
                before = await self.shared.begin(stream)  # before its first byte: the meta, then the bytes
                if before is not None and before != stream.sid:
                    self._overlap(before)
        except BaseException as exc:
            self._beginning.discard(stream)
            if isinstance(exc, asyncio.CancelledError):
                await self._finish(stream, "interrupted", stream.meta.on_crash.encode())
            else:
                log.warning("stream %s could not begin: %s", stream.meta.conversation_id, exc)
                await self._finish(stream, "failed", error_event(f"the stream could not begin: {exc}"))
            await self._never_ran(stream, producer)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self._beginning.discard(stream)
        if not stream.live:  # the server began its shutdown meanwhile
            await self._never_ran(stream, producer)
            return
        await self._pump(stream, producer, error_event)

    async def _never_ran(self, stream: Stream, producer: AsyncIterator[bytes]) -> None:
        """Stop a generation whose stream ended before it began: closing a
        generator never started runs none of its `finally` blocks."""
        self._dirty(stream)
        if stream.stop_fn is not None:
            with contextlib.suppress(Exception):
                await stream.stop_fn()
        await close_quietly(producer)

    def _overlap(self, sid: str) -> None:
        """The conversation's stream before this one, as Redis had it: if it
        is another node's and still live, it began at the same moment as this
        one there (each node's `_stop` found nothing yet). This one, begun
        later, stops it, as a second start on one node stops the first."""
        async def stop_it() -> None:
            assert self.shared is not None
            try:
                found = await self.shared.stream(sid)
            except Exception as exc:  # Redis away: both run, as before it came back
                log.warning("looking at stream %s in Redis failed: %s", sid, exc)
                return
            if found is not None and found[0].state == LIVE and found[0].owner != self.shared.owner:
                await self._stop_remote(RemoteStream(self.shared, *found), 10.0)
        task = asyncio.ensure_future(stop_it())
        self._overlaps.add(task)
        task.add_done_callback(self._overlaps.discard)

    def _claim(self, conversation_id: str) -> asyncio.Lock:
        lock = self._claims.get(conversation_id)
        if lock is None:
            lock = self._claims[conversation_id] = asyncio.Lock()
        return lock

    def _begin(self, conversation_id: str, kind: str, model: str | None, stop: StopFn,
               error_event: Callable[[str], bytes], context: object, holder: str, request: str = "") -> Stream:
        meta = Meta(sid=secrets.token_hex(12), conversation_id=conversation_id, kind=kind, model=model,
                    created=time.time(), owner=self.owner.name if self.owner else "",
                    on_crash=error_event(CRASH_MESSAGE).decode(), holder=holder, request=request)
        stream = Stream(meta, self.folder, self.cap)
        stream.stop_fn, stream.context, stream.error_event = stop, context, error_event
        previous = self.by_id.get(conversation_id)
        if previous is not None:
            self.gone.append(previous)
        self.by_id[conversation_id] = stream
        self._dirty(stream)
        self._start_gc()
        return stream

    async def _record(self, stream: Stream) -> None:
        """Write a new stream's record now, on the writer's thread (its next
        flush would come up to `disk.FLUSH_S` later), and wait for it: if the
        process dies the moment a reader got the first byte, the restart still
        ends the stream with its crash event."""
        if self.writer is not None and stream.folder is not None:
            await asyncio.wrap_future(self.writer.now(stream))

    async def _pump(self, stream: Stream, producer: AsyncIterator[bytes], error_event) -> None:
        surface = surfaces.BY_NAME.get(stream.meta.kind)
        tail = b""  # the last bytes, to tell a stream that ended with its protocol's error event
        try:
            async for chunk in producer:
                stream.append(chunk)
                self._hold_total(stream, len(chunk))
                tail = (tail + chunk)[-TAIL:]
                self._dirty(stream)
                if self.shared is not None:
                    await self.shared.sync(stream)
            failed = (stream.failed_fn is not None and stream.failed_fn()) or \
                (surface is not None and surface.ends_in_error(tail))
            await self._finish(stream, "stopped" if stream.stopping else "failed" if failed else "done")
        except asyncio.CancelledError:
            await self._finish(stream, "interrupted", stream.meta.on_crash.encode())
            raise
        except Exception as exc:  # a bug in the producer: the stream still ends, and says so
            log.exception("stream %s failed", stream.meta.conversation_id)
            await self._finish(stream, "failed", error_event(f"the stream failed: {type(exc).__name__}: {exc}"))
        finally:
            self._dirty(stream)
            await close_quietly(producer)

    async def _finish(self, stream: Stream, state: str, tail: bytes = b"") -> None:
        if not stream.live:
            return
        before = stream.end
        stream.finish(state, tail)
        self._held += stream.end - before
        if self.shared is not None:
            await self.shared.sync(stream, final=True)

    def _relay_only(self, conversation_id: str, producer: AsyncIterator[bytes], stop: StopFn
                    ) -> AsyncIterator[bytes]:
        """The generation's bytes straight to its one reader; stoppable by id meanwhile."""
        self.relayed[conversation_id] = stop

        async def relay():
            try:
                async for chunk in producer:
                    yield chunk
            finally:
                if self.relayed.get(conversation_id) is stop:
                    del self.relayed[conversation_id]
                await close_quietly(producer)
        return relay()

    async def taken(self, conversation_id: str, holder: str) -> bool:
        """Whether the conversation has a stream another key than `holder`'s holds."""
        before = await self.find(conversation_id)
        return before is not None and not holders.may_see(before.meta.holder, holder)

    async def stop(self, conversation_id: str, wait_s: float = 10.0,
                   holder: str | None = None) -> Stream | RemoteStream | None:
        """Stop the conversation's live generation (if any) and wait, at most
        `wait_s`, for its stream to end. Returns its stream (None: unknown,
        or held by another key than `holder`'s when one is given)."""
        async with self._claim(conversation_id):
            if holder is not None:
                known = await self.find(conversation_id)
                if known is not None and not holders.may_see(known.meta.holder, holder):
                    return None
            return await self._stop(conversation_id, wait_s)

    async def _stop(self, conversation_id: str, wait_s: float = 10.0) -> Stream | RemoteStream | None:
        relayed = self.relayed.pop(conversation_id, None)
        if relayed is not None:
            await relayed()
        stream = self.by_id.get(conversation_id)
        if (stream is None or not stream.live) and self.shared is not None:
            remote = await self._find_remote(conversation_id, stream)
            if remote is not None:
                return await self._stop_remote(remote, wait_s)
        if stream is None or not stream.live:
            return stream
        await self._stop_local(stream, wait_s)
        return stream

    async def _stop_local(self, stream: Stream, wait_s: float) -> None:
        stream.stopping = True
        if stream.stop_fn is not None:
            with contextlib.suppress(Exception):
                await stream.stop_fn()
        try:
            await asyncio.wait_for(asyncio.shield(stream.done.wait()), wait_s)
        except asyncio.TimeoutError:  # the generation did not answer the stop: end it here
            if stream.task is not None:
                stream.task.cancel()
            tail = stream.error_event(f"the generation did not stop within {wait_s:g}s of being asked; "
                                      "its stream ends here") if stream.error_event else b""
            await self._finish(stream, "stopped", tail)
            self._dirty(stream)

    async def _stop_remote(self, remote: RemoteStream, wait_s: float) -> RemoteStream:
        """Another node's live stream: that node stops it; this one waits for its end."""
        try:
            if remote.live:
                # That stream, by its sid: never what its node would find as the conversation's latest now
                answer = await remote.call("stop", {"wait_s": wait_s, "sid": remote.sid}, wait_s + 5)
                if answer is None:  # nobody listens under its name: if its node died, the stream ends here
                    await remote.refresh()
                await remote.wait_ended(wait_s if answer is None else 2.0)
        except Exception as exc:  # Redis away: the stream is answered as last seen
            log.warning("stopping stream %s on its node failed: %s", remote.meta.conversation_id, exc)
        return remote

    async def _command(self, op: str, conversation_id: str, args: dict) -> dict:
        """What another node asks of one of this node's streams."""
        if op == "stop" and args.get("sid"):  # one stream of this node's, only while it runs
            async with self._claim(conversation_id):
                own = self.by_id.get(conversation_id)
                if own is None or own.sid != args["sid"]:
                    return {"state": None}
                if own.live:
                    await self._stop_local(own, float(args.get("wait_s", 10.0)))
                return {"state": own.meta.state}
        if op == "stop":
            stream = await self.stop(conversation_id, float(args.get("wait_s", 10.0)))
            return {"state": stream.meta.state if stream is not None else None}
        stream = self.by_id.get(conversation_id)
        handle = getattr(stream.context, "remote_call", None) if stream is not None and stream.live else None
        if op != "call":
            return {"error": f"unknown command {op!r}"}
        if handle is None:  # it ended (the asker saw it live a moment ago): it takes nothing more
            return {"ended": True}
        return await handle(args)

    async def share(self, stream: Stream, ctx: dict) -> None:
        """What other nodes may read of `stream` beside its bytes (its owner's state)."""
        if self.shared is not None:
            await self.shared.share(stream, ctx)

    # -- reading --------------------------------------------------------------
    async def find(self, conversation_id: str, holder: str | None = None) -> Stream | RemoteStream | None:
        """`get`, or with Redis the conversation's latest stream on any node;
        None for a stream another key than `holder`'s holds, when one is given."""
        local = self.get(conversation_id)
        found: Stream | RemoteStream | None = local
        if self.shared is not None:
            found = await self._find_remote(conversation_id, local) or local
        if found is not None and holder is not None and not holders.may_see(found.meta.holder, holder):
            return None
        return found

    async def _find_remote(self, conversation_id: str, local: Stream | None) -> RemoteStream | None:
        """The conversation's latest stream, when it is another node's (None: this node's, or none)."""
        assert self.shared is not None
        try:
            found = await self.shared.find(conversation_id)
        except Exception as exc:  # Redis away: this node's own streams still answer
            log.warning("looking for stream %s in Redis failed: %s", conversation_id, exc)
            return None
        if found is None or (local is not None and found[0] == local.sid):
            return None
        sid, meta, ctx = found
        if sid in {s.sid for s in self.gone}:  # this node's, already replaced here
            return None
        return RemoteStream(self.shared, meta, ctx)

    async def replayable(self, conversation_id: str, holder: str,
                         request: Callable[[], str]) -> Stream | RemoteStream | None:
        """The conversation's stream when it was started by a request identical
        to this one (`request()`, its `request_key`, worked out only when the
        conversation has a stream to compare with) and can be followed from its
        first byte (live, or ended `done`, and nothing dropped); else None."""
        if not self.record:
            return None
        stream = await self.find(conversation_id, holder)  # with Redis, another web node's too
        if stream is None or not stream.meta.request or not hmac.compare_digest(stream.meta.request, request()):
            return None
        if stream.meta.state not in REPLAYABLE or stream.start != 0:
            return None
        self.replays += 1
        return stream

    def get(self, conversation_id: str) -> Stream | None:
        self._start_gc()
        stream = self.by_id.get(conversation_id)
        if stream is not None and self._expired(stream, time.time()):
            return None
        return stream

    async def lookup(self, ids: list, holder: str = "") -> list[dict]:
        """The streams of these conversations that are live or replayable and
        `holder` may see; never any other's."""
        if not isinstance(ids, list) or len(ids) > MAX_LOOKUP:
            raise StreamRefused(f"conversation_ids must be a list of at most {MAX_LOOKUP} ids",
                                param="conversation_ids")
        found = []
        for value in ids:
            if not isinstance(value, str):
                raise StreamRefused("conversation_ids must hold strings", param="conversation_ids")
            stream = await self.find(value, holder)
            if stream is not None:
                found.append(stream.meta.public())
            elif value in self.relayed:
                found.append({"conversation_id": value, "status": LIVE})
        return found

    def live_count(self) -> int:
        return sum(1 for s in self.by_id.values() if s.live) + len(self.relayed)

    def unread_count(self) -> int:
        """Live generations no client follows (each one a client left): no request in flight counts them."""
        return sum(1 for s in self.by_id.values() if s.live and s.followers == 0)

    def stats(self) -> dict:
        kept = [s for s in self.by_id.values() if not s.live]
        return {"live": self.live_count(), "stored": len(kept), "bytes": self._bytes(),
                "following": sum(s.followers for s in self.by_id.values()),
                "ttl_s": self.ttl_s, "max_stream_bytes": self.cap, "max_total_bytes": self.total,
                "durable": self.folder is not None and self.record, "replays": self.replays}


async def close_quietly(chunks: AsyncIterator[bytes]) -> None:
    """Close an async generator (its `finally` blocks run now); what closing raises is of no use here."""
    close = getattr(chunks, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


__all__ = ["Gone", "Stream", "StreamRefused", "Streams", "check_id", "close_quietly"]
