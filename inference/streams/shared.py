"""Resumable streams shared by several web nodes through Redis (HEARTH_REDIS_URL).

Each node still records its own generations (`store.Streams`, memory and
its disk); with Redis it also copies them there, so a reconnect that lands
on another node finds the stream, replays it and follows it live, and can
stop it:

- `hearth:streams:conv:<conversation id>`: the id (`sid`) of its latest stream.
- `hearth:streams:meta:<sid>`: the stream's `log.Meta` (hash fields), plus
  `ctx`: what its owner shares of it (a chat turn's current segment).
- `hearth:streams:data:<sid>`: its bytes as a Redis stream, one entry per
  append, the entry's id `<end offset>-0`. A read from byte N asks for the
  entries after id `N-0`; the first holds byte N. Trimming to a new start
  drops the entries that end at or before it (`XTRIM MINID`).
- `hearth:streams:owner:<owner>`: a node's heartbeat (expires in `OWNER_TTL_S`).
  A stream still live whose owner's heartbeat is gone belonged to a node
  that died: the first reader to see it ends it with its crash event.
- `hearth:streams:cmd:<owner>`: the node's command channel (pub/sub): stop
  a stream, or pass a call to what owns it (the chat's queue and approvals),
  answered on a one-off list `hearth:streams:reply:<token>`.

Every key of a stream expires: while live after `LIVE_TTL_S` (renewed on
each append), once ended after the store's TTL. Redis errors never fail a
generation: the copy of that stream stops, with a warning.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from inference.streams.log import LIVE, Meta, Stream

log = logging.getLogger("hearth.streams")

P = "hearth:streams:"
OWNER_TTL_S = 6.0
BEAT_S = 2.0
LIVE_TTL_S = 3600.0
BLOCK_MS = 1000
CALL_WAIT_S = 10.0
INT_FIELDS = ("start", "end")
FLOAT_FIELDS = ("created", "ended_at")

Handler = Callable[[str, str, dict], Awaitable[dict]]


def _meta_fields(meta: Meta) -> dict:
    return {k: ("" if v is None else str(v)) for k, v in meta.__dict__.items()}


def _meta(raw: dict) -> Meta | None:
    if not raw:
        return None
    known = Meta.__dataclass_fields__
    fields: dict[str, Any] = {k.decode(): v.decode() for k, v in raw.items() if k.decode() in known}
    for k in INT_FIELDS:
        fields[k] = int(fields.get(k) or 0)
    for k in FLOAT_FIELDS:
        fields[k] = float(fields[k]) if fields.get(k) else None
    fields["model"] = fields.get("model") or None
    try:
        return Meta(**fields)
    except TypeError:
        return None


class Shared:
    """One node's view of the streams in Redis."""

    def __init__(self, url: str, owner: str, ttl_s: float, cap: int):
        import redis.asyncio as aioredis

        self.url, self.owner, self.ttl_s, self.cap = url, owner, ttl_s, cap
        self.redis: Any = aioredis.Redis.from_url(url, socket_timeout=BLOCK_MS / 1000 + 10)
        self._tasks: list[asyncio.Task] = []
        self._broken: set[str] = set()  # sids whose copy stopped after a Redis error
        self._beating: bool | None = None  # None until the first try
        self._listening: bool | None = None
        self._ready = asyncio.Event()

    # -- this node -----------------------------------------------------------
    async def run(self, handler: Handler) -> None:
        """Beat, and answer commands sent to this node (on the running loop).
        The first beat and the subscription are in place when this returns:
        a stream begun after it is never taken for a dead node's."""
        if self._tasks:
            return
        self._tasks = [asyncio.ensure_future(self._beat()), asyncio.ensure_future(self._listen(handler))]
        with contextlib.suppress(asyncio.TimeoutError):  # a Redis that hangs costs a start 10 s, once
            await asyncio.wait_for(asyncio.shield(self._ready.wait()), 10)

    async def _beat(self) -> None:
        while True:
            try:
                await self.redis.set(P + "owner:" + self.owner, "1", px=int(OWNER_TTL_S * 1000))
                self._beating = True
            except Exception as exc:  # Redis away for a while: try again on the next beat
                log.warning("stream heartbeat in Redis failed: %s", exc)
                self._beating = False
            self._mark_ready()
            await asyncio.sleep(BEAT_S)

    async def _listen(self, handler: Handler) -> None:
        while True:
            try:
                pubsub = self.redis.pubsub()
                await pubsub.subscribe(P + "cmd:" + self.owner)
                self._listening = True
                self._mark_ready()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        asyncio.ensure_future(self._answer(handler, message["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("stream commands from Redis: %s; listening again", exc)
                self._listening = False
                self._mark_ready()  # tried: a start does not wait on a Redis that is away
                await asyncio.sleep(1.0)

    def _mark_ready(self) -> None:
        if self._beating is not None and self._listening is not None:
            self._ready.set()

    async def _answer(self, handler: Handler, data: bytes) -> None:
        try:
            command = json.loads(data)
            result = await handler(command["op"], command["cid"], command.get("args") or {})
        except Exception as exc:
            log.exception("stream command failed")
            result = {"error": f"{type(exc).__name__}: {exc}"}
            command = command if isinstance(locals().get("command"), dict) else {}
        reply = command.get("reply")
        if reply:
            with contextlib.suppress(Exception):
                await self.redis.rpush(reply, json.dumps(result))
                await self.redis.expire(reply, 30)

    def shutdown(self, ended: list[tuple[Stream, bytes]]) -> None:
        """The server stops (its loop with it): record how its live streams
        ended (each with the tail its end added) and stop beating, with a
        blocking client."""
        import redis

        for task in self._tasks:
            task.cancel()
        client: Any = redis.Redis.from_url(self.url, socket_timeout=5)
        try:
            ttl = max(1, int(self.ttl_s))
            for stream, tail in ended:
                if stream.sid in self._broken:
                    continue
                meta = stream.meta
                with client.pipeline(transaction=True) as pipe:
                    if tail:
                        pipe.xadd(P + "data:" + meta.sid, {"d": tail}, id=f"{meta.end}-0")
                    pipe.hset(P + "meta:" + meta.sid, mapping=_meta_fields(meta))
                    for key in (P + "data:" + meta.sid, P + "meta:" + meta.sid):
                        pipe.expire(key, ttl)
                    pipe.execute()
            client.delete(P + "owner:" + self.owner)
        except Exception as exc:  # readers end them when this node's heartbeat has gone
            log.warning("shutdown: the streams in Redis were not all ended: %s", exc)
        finally:
            client.close()

    # -- writing this node's streams --------------------------------------------
    async def _guard(self, stream: Stream, work: Awaitable) -> None:
        if stream.sid in self._broken:
            work.close()  # type: ignore[attr-defined]
            return
        try:
            await work
        except Exception as exc:
            self._broken.add(stream.sid)
            log.warning("stream %s is no longer copied to Redis (other nodes cannot follow it): %s",
                        stream.meta.conversation_id, exc)

    async def begin(self, stream: Stream) -> None:
        async def work():
            meta = stream.meta
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(P + "meta:" + meta.sid, mapping=_meta_fields(meta))
                pipe.expire(P + "meta:" + meta.sid, int(LIVE_TTL_S))
                pipe.set(P + "conv:" + meta.conversation_id, meta.sid, ex=int(LIVE_TTL_S))
                await pipe.execute()
        await self._guard(stream, work())

    async def append(self, stream: Stream, data: bytes) -> None:
        """`data` was just appended to `stream` (which may have dropped its head)."""
        async def work():
            meta, sid = stream.meta, stream.sid
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(P + "data:" + sid, {"d": data}, id=f"{meta.end}-0")
                pipe.hset(P + "meta:" + sid, mapping={"end": meta.end, "start": meta.start})
                if meta.start:
                    pipe.xtrim(P + "data:" + sid, minid=f"{meta.start + 1}-0")
                for key in (P + "data:" + sid, P + "meta:" + sid):
                    pipe.expire(key, int(LIVE_TTL_S))
                await pipe.execute()
        if data:
            await self._guard(stream, work())

    async def share(self, stream: Stream, ctx: dict) -> None:
        await self._guard(stream, self.redis.hset(P + "meta:" + stream.sid, "ctx", json.dumps(ctx)))

    async def finish(self, stream: Stream, tail: bytes) -> None:
        """`stream` ended; `tail`, its last bytes, may not have been copied yet."""
        async def work():
            meta, sid = stream.meta, stream.sid
            ttl = max(1, int(self.ttl_s))
            async with self.redis.pipeline(transaction=True) as pipe:
                if tail:
                    pipe.xadd(P + "data:" + sid, {"d": tail}, id=f"{meta.end}-0")
                pipe.hset(P + "meta:" + sid, mapping=_meta_fields(meta))
                for key in (P + "data:" + sid, P + "meta:" + sid):
                    pipe.expire(key, ttl)
                await pipe.execute()
            await self._expire_pointer(meta.conversation_id, sid, ttl)
        await self._guard(stream, work())
        self._broken.discard(stream.sid)

    async def _expire_pointer(self, conversation_id: str, sid: str, ttl: int) -> None:
        key = P + "conv:" + conversation_id
        if await self.redis.get(key) == sid.encode():  # a newer stream may have taken it meanwhile
            await self.redis.expire(key, ttl)

    # -- any node's streams -----------------------------------------------------
    async def find(self, conversation_id: str) -> tuple[str, Meta, dict] | None:
        """The conversation's latest stream in Redis: (sid, meta, ctx), or None."""
        sid = await self.redis.get(P + "conv:" + conversation_id)
        if sid is None:
            return None
        raw = await self.redis.hgetall(P + "meta:" + sid.decode())
        meta = _meta(raw)
        if meta is None:
            return None
        ctx = json.loads(raw.get(b"ctx") or b"{}")
        if meta.state == LIVE and not await self.owner_alive(meta.owner):
            meta = await self.end_orphan(meta)
        return meta.sid, meta, ctx

    async def owner_alive(self, owner: str) -> bool:
        return owner == self.owner or bool(await self.redis.exists(P + "owner:" + owner))

    async def end_orphan(self, meta: Meta) -> Meta:
        """A live stream whose node died: end it with its crash event, once
        (the first node to see it does it; the others read what it wrote)."""
        sid = meta.sid
        if await self.redis.hsetnx(P + "meta:" + sid, "ending", self.owner):
            last = await self.redis.xrevrange(P + "data:" + sid, count=1)
            tail = meta.on_crash.encode()
            if last and not last[0][1][b"d"].endswith(b"\n\n"):
                tail = b"\n\n" + tail  # after a chunk cut mid-event the error still starts an event
            end = int(last[0][0].decode().split("-")[0]) if last else meta.end
            meta.state, meta.ended_at, meta.end = "interrupted", time.time(), end + len(tail)
            ttl = max(1, int(self.ttl_s))
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(P + "data:" + sid, {"d": tail}, id=f"{meta.end}-0")
                pipe.hset(P + "meta:" + sid, mapping=_meta_fields(meta))
                for key in (P + "data:" + sid, P + "meta:" + sid):
                    pipe.expire(key, ttl)
                await pipe.execute()
            await self._expire_pointer(meta.conversation_id, sid, ttl)
            return meta
        for _ in range(50):  # another node is ending it
            fresh = _meta(await self.redis.hgetall(P + "meta:" + sid))
            if fresh is None or fresh.state != LIVE:
                return fresh or meta
            await asyncio.sleep(0.05)
        return meta

    async def call(self, owner: str, op: str, conversation_id: str, args: dict | None = None,
                   wait_s: float = CALL_WAIT_S) -> dict | None:
        """Ask the node `owner` to do `op` on its stream; its answer, or None
        when no node listens under that name or it did not answer in time."""
        reply = P + "reply:" + secrets.token_hex(12)
        command = json.dumps({"op": op, "cid": conversation_id, "args": args or {}, "reply": reply})
        if not await self.redis.publish(P + "cmd:" + owner, command):
            return None
        answer = await self.redis.blpop([reply], timeout=wait_s)
        return json.loads(answer[1]) if answer else None


class RemoteStream:
    """Another node's stream, read from Redis: what the routes and the chat
    read of a `log.Stream` (meta, offsets, `follow`), and a way to its owner."""

    def __init__(self, shared: Shared, meta: Meta, ctx: dict):
        self.shared, self.meta, self.ctx = shared, meta, ctx
        self.cap = shared.cap
        self.followers = 0
        self.context = None

    sid = property(lambda self: self.meta.sid)
    live = property(lambda self: self.meta.state == LIVE)
    start = property(lambda self: self.meta.start)
    end = property(lambda self: self.meta.end)
    check_offset = Stream.check_offset
    after_crash = Stream.after_crash

    async def refresh(self) -> None:
        fresh = _meta(await self.shared.redis.hgetall(P + "meta:" + self.sid))
        if fresh is None:  # expired: nothing more will come
            self.meta.state = self.meta.state if self.meta.state != LIVE else "interrupted"
            return
        if fresh.state == LIVE and not await self.shared.owner_alive(fresh.owner):
            fresh = await self.shared.end_orphan(fresh)
        self.meta = fresh

    async def call(self, op: str, args: dict | None = None) -> dict | None:
        return await self.shared.call(self.meta.owner, op, self.meta.conversation_id, args)

    async def wait_ended(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while self.live and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            await self.refresh()
        return not self.live

    async def follow(self, offset: int) -> AsyncIterator[bytes]:
        """As `log.Stream.follow`: the bytes from `offset`, then live until it ends."""
        key = P + "data:" + self.sid
        redis = self.shared.redis
        while True:
            entries = await redis.xrange(key, min=f"({offset}-0", count=64)
            if entries:
                for entry_id, fields in entries:
                    end = int(entry_id.decode().split("-")[0])
                    data = fields[b"d"]
                    begins = end - len(data)
                    if begins > offset:
                        return  # dropped under this reader (the cap): it reconnects
                    yield data[offset - begins:]
                    offset = end
                continue
            if not self.live:
                await self.refresh()  # a last entry may have come with the end
                if offset >= self.meta.end:
                    return
                continue
            got = await redis.xread({key: f"{offset}-0"}, block=BLOCK_MS, count=1)
            if not got:
                await self.refresh()

