"""Resumable streams shared by several web nodes through Redis (HEARTH_REDIS_URL).

Each node still records its own generations (`store.Streams`, memory and
its disk); with Redis it also copies them there, so a reconnect that lands
on another node finds the stream, replays it and follows it live, and can
stop it:

- `hearth:streams:conv:<conversation id>`: the id (`sid`) of its latest stream.
- `hearth:streams:meta:<sid>`: the stream's `log.Meta` (hash fields), plus
  `ctx`: what its owner shares of it (a chat turn's current segment).
- `hearth:streams:data:<sid>`: its bytes as a Redis stream, one entry per
  write, the entry's id `<end offset>-0`. A read from byte N asks for the
  entries after id `N-0`; the first holds byte N. Trimming to a new start
  drops the entries that end at or before it (`XTRIM MINID`). An ended
  stream's last entry is an empty marker, `<end>-1`, that wakes followers.
- `hearth:streams:owner:<owner>`: a node's heartbeat (expires in `OWNER_TTL_S`).
  A stream still live whose owner's heartbeat is gone belonged to a node
  that died: the first reader to see it ends it with its crash event.

Each write is one Lua script (`WRITE`, `ORPHAN`), so it is whole or not at
all, and a stream ended by one node (a dead owner's, by a reader) takes no
more bytes from another (an owner that was only slow stops copying it).
Each node remembers how far Redis has each of its streams (`Stream.mirrored`):
a write that failed is caught up by the next one, and the end always is.
- `hearth:streams:cmd:<owner>`: the node's command channel (pub/sub): stop
  a stream, or pass a call to what owns it (the chat's queue and approvals),
  answered on a one-off list `hearth:streams:reply:<token>`.

Every key of a stream expires: while live after `LIVE_TTL_S` (renewed on
each append), once ended after the store's TTL. Redis errors never fail a
generation: its copy waits `RETRY_S` and then catches up, with a warning.

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

from core import surfaces
from serving.streams.log import LIVE, Meta, Stream

log = logging.getLogger("hearth.streams")

P = "hearth:streams:"
OWNER_TTL_S = 10.0  # a node whose loop stalls longer than this minus a beat is taken for dead
BEAT_S = 2.0
RETRY_S = 5.0  # after a failed write, a stream's next writes wait this long (its end never does)
LIVE_TTL_S = 3600.0
BLOCK_MS = 1000
CALL_WAIT_S = 10.0
INT_FIELDS = ("start", "end")
FLOAT_FIELDS = ("created", "ended_at")

Handler = Callable[[str, str, dict], Awaitable[dict]]

# KEYS: meta, data, pointer. ARGV: sid, end, bytes, start, ttl, final fields (JSON, or "").
WRITE = r"""
if redis.call('HGET', KEYS[1], 'state') ~= 'live' then return 0 end
if ARGV[3] ~= '' then redis.call('XADD', KEYS[2], ARGV[2] .. '-0', 'd', ARGV[3]) end
redis.call('HSET', KEYS[1], 'end', ARGV[2], 'start', ARGV[4])
if tonumber(ARGV[4]) > 0 then redis.call('XTRIM', KEYS[2], 'MINID', (tonumber(ARGV[4]) + 1) .. '-0') end
if ARGV[6] ~= '' then
  for k, v in pairs(cjson.decode(ARGV[6])) do redis.call('HSET', KEYS[1], k, v) end
  redis.call('XADD', KEYS[2], ARGV[2] .. '-1', 'd', '')
end
local ttl = tonumber(ARGV[5])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
if redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('EXPIRE', KEYS[3], ttl) end
return 1
"""

# KEYS: meta, data, pointer. ARGV: sid, crash event, now, ttl.
ORPHAN = r"""
if redis.call('HGET', KEYS[1], 'state') ~= 'live' then return 0 end
local finish = tonumber(redis.call('HGET', KEYS[1], 'end') or '0')
local tail = ARGV[2]
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last > 0 then
  finish = tonumber(string.match(last[1][1], '^(%d+)'))
  local d = last[1][2][2]
  if #d > 0 and string.sub(d, -2) ~= '\n\n' then tail = '\n\n' .. tail end
end
finish = finish + #tail
redis.call('XADD', KEYS[2], finish .. '-0', 'd', tail)
redis.call('XADD', KEYS[2], finish .. '-1', 'd', '')
redis.call('HSET', KEYS[1], 'state', 'interrupted', 'ended_at', ARGV[3], 'end', finish, 'on_crash', ARGV[2])
local ttl = tonumber(ARGV[4])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
if redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('EXPIRE', KEYS[3], ttl) end
return 1
"""


# KEYS: meta, pointer. ARGV: sid, ttl, then the meta's fields and values.
# Returns the stream the pointer named before (""), so two starts of one
# conversation at once on two nodes are put in an order: the later one stops the other.
BEGIN = r"""
local before = redis.call('GET', KEYS[2])
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
redis.call('SET', KEYS[2], ARGV[1], 'EX', tonumber(ARGV[2]))
return before or ''
"""


def _keys(sid: str, conversation_id: str) -> list[str]:
    return [P + "meta:" + sid, P + "data:" + sid, P + "conv:" + conversation_id]


def fail_fast_client(module: Any, url: str) -> Any:
    """A client that fails fast: one try per command (a Redis that is away
    must not hold a generation or a request for long)."""
    from redis.backoff import NoBackoff

    return module.Redis.from_url(url, socket_timeout=BLOCK_MS / 1000 + 4, socket_connect_timeout=3,
                                 retry=module.retry.Retry(NoBackoff(), 0))


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
        self.redis: Any = fail_fast_client(aioredis, url)
        self._write = self.redis.register_script(WRITE)
        self._orphan = self.redis.register_script(ORPHAN)
        self._begin = self.redis.register_script(BEGIN)
        self._tasks: list[asyncio.Task] = []
        self._answers: set[asyncio.Task] = set()
        self._retry_at: dict[str, float] = {}  # sid -> when its copy is tried again after a failed write
        self._lost: set[str] = set()  # sids another node ended (this one was taken for dead)
        self._beating: bool | None = None  # None until the first try
        self._listening: bool | None = None
        self._ready = asyncio.Event()

    # -- this node -----------------------------------------------------------
    async def run(self, handler: Handler) -> None:
        """Beat, and answer commands sent to this node (on the running loop).
        The first beat and the subscription are in place when this returns
        (or have been tried, if Redis is away): a stream begun after it is
        never taken for a dead node's."""
        if not self._tasks:
            self._tasks = [asyncio.ensure_future(self._beat()), asyncio.ensure_future(self._listen(handler))]
        with contextlib.suppress(asyncio.TimeoutError):  # a Redis that hangs costs a start 10 s
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
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(P + "cmd:" + self.owner)
                self._listening = True
                self._mark_ready()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        task = asyncio.ensure_future(self._answer(handler, message["data"]))
                        self._answers.add(task)
                        task.add_done_callback(self._answers.discard)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("stream commands from Redis: %s; listening again", exc)
                self._listening = False
                self._mark_ready()  # tried: a start does not wait on a Redis that is away
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _mark_ready(self) -> None:
        if self._beating is not None and self._listening is not None:
            self._ready.set()

    async def _answer(self, handler: Handler, data: bytes) -> None:
        command: dict = {}
        try:
            command = json.loads(data)
            result = await handler(command["op"], command["cid"], command.get("args") or {})
        except Exception as exc:
            log.exception("stream command failed")
            result = {"error": f"{type(exc).__name__}: {exc}"}
        reply = command.get("reply") if isinstance(command, dict) else None
        if reply:
            with contextlib.suppress(Exception):
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.rpush(reply, json.dumps(result))
                    pipe.expire(reply, 30)
                    await pipe.execute()

    def shutdown(self, streams: list[Stream]) -> None:
        """The server stops (its loop with it): record how its streams that
        were live ended, bytes and all, and stop beating, with a blocking client."""
        import redis

        for task in self._tasks:
            task.cancel()
        client = fail_fast_client(redis, self.url)
        try:
            write = client.register_script(WRITE)
            for stream in streams:
                with stream.lock:
                    frm = max(stream.mirrored, stream.mem_start, stream.meta.start)
                    data = bytes(stream.mem[frm - stream.mem_start:])
                self._run_write(write, stream, data, final=True)
            client.delete(P + "owner:" + self.owner)
        except Exception as exc:  # readers end them when this node's heartbeat has gone
            log.warning("shutdown: the streams in Redis were not all ended: %s", exc)
        finally:
            client.close()

    # -- writing this node's streams --------------------------------------------
    def _args(self, stream: Stream, data: bytes, final: bool) -> tuple[list[str], list]:
        meta = stream.meta
        ttl = max(1, int(self.ttl_s)) if final else int(LIVE_TTL_S)
        fields = json.dumps(_meta_fields(meta)) if final else ""
        return _keys(meta.sid, meta.conversation_id), [meta.sid, meta.end, data, meta.start, ttl, fields]

    def _run_write(self, script, stream: Stream, data: bytes, final: bool) -> None:
        keys, args = self._args(stream, data, final)
        if not script(keys=keys, args=args):
            self._lost.add(stream.sid)
        stream.mirrored = stream.meta.end

    async def begin(self, stream: Stream) -> str | None:
        """Record `stream` as its conversation's latest; the stream that was
        the latest before it (its sid), or None."""
        meta = stream.meta
        fields = [x for pair in _meta_fields(meta).items() for x in pair]
        try:
            before = await self._begin(keys=[P + "meta:" + meta.sid, P + "conv:" + meta.conversation_id],
                                       args=[meta.sid, int(LIVE_TTL_S), *fields])
        except Exception as exc:
            self._failed(stream, exc)
            return None
        before = before.decode() if isinstance(before, bytes) else before
        return before or None

    async def stream(self, sid: str) -> tuple[Meta, dict] | None:
        """One stream's meta and shared state, by its sid (None once its keys are gone)."""
        raw = await self.redis.hgetall(P + "meta:" + sid)
        meta = _meta(raw)
        return None if meta is None else (meta, json.loads(raw.get(b"ctx") or b"{}"))

    async def sync(self, stream: Stream, final: bool = False) -> None:
        """Copy what Redis lacks of `stream` (normally the bytes just
        appended); `final`: it has ended, so its state and end go too, and
        a write that failed before is tried again now."""
        sid = stream.sid
        if sid in self._lost:
            if final:
                self._lost.discard(sid)
            return
        if not final and time.monotonic() < self._retry_at.get(sid, 0.0):
            return
        if stream.mirrored == stream.end and not final:
            return
        try:
            frm = max(stream.mirrored, stream.start)
            data = await stream.read(frm, stream.end - frm) if stream.end > frm else b""
            keys, args = self._args(stream, data, final)
            if not await self._write(keys=keys, args=args):
                self._lost.add(sid)
                log.warning("stream %s was ended by another node (this one was taken for dead); it is no longer "
                            "copied to Redis", stream.meta.conversation_id)
            stream.mirrored = stream.end
            self._retry_at.pop(sid, None)
        except Exception as exc:
            self._failed(stream, exc)
        if final:
            self._retry_at.pop(sid, None)
            self._lost.discard(sid)

    def _failed(self, stream: Stream, exc: Exception) -> None:
        if stream.sid not in self._retry_at:
            log.warning("stream %s could not be copied to Redis (other nodes cannot follow it for now): %s",
                        stream.meta.conversation_id, exc)
        self._retry_at[stream.sid] = time.monotonic() + RETRY_S

    async def share(self, stream: Stream, ctx: dict) -> None:
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(P + "meta:" + stream.sid, "ctx", json.dumps(ctx))
                pipe.expire(P + "meta:" + stream.sid, int(LIVE_TTL_S))
                await pipe.execute()
        except Exception as exc:
            self._failed(stream, exc)

    # -- any node's streams -----------------------------------------------------
    async def find(self, conversation_id: str) -> tuple[str, Meta, dict] | None:
        """The conversation's latest stream in Redis: (sid, meta, ctx), or None."""
        sid = await self.redis.get(P + "conv:" + conversation_id)
        found = None if sid is None else await self.stream(sid.decode())
        if found is None:
            return None
        meta, ctx = found
        if meta.state == LIVE and not await self.owner_alive(meta.owner):
            meta = await self.end_orphan(meta)
        return meta.sid, meta, ctx

    async def owner_alive(self, owner: str) -> bool:
        return owner == self.owner or bool(await self.redis.exists(P + "owner:" + owner))

    async def end_orphan(self, meta: Meta) -> Meta:
        """A live stream whose node died: end it with its crash event (one
        script: the first node to see it does it, whole; the others find it ended)."""
        await self._orphan(keys=_keys(meta.sid, meta.conversation_id),
                           args=[meta.sid, await self._crash_event(meta), time.time(), max(1, int(self.ttl_s))])
        return _meta(await self.redis.hgetall(P + "meta:" + meta.sid)) or meta

    async def _crash_event(self, meta: Meta) -> str:
        """`meta.on_crash`, numbered after the last event Redis has of the
        stream when its protocol numbers them (read whole: once, for a dead node's stream)."""
        surface = surfaces.BY_NAME.get(meta.kind)
        if surface is None or not surface.numbered:
            return meta.on_crash
        entries = await self.redis.xrange(P + "data:" + meta.sid)
        last = surfaces.last_sequence_number(b"".join(fields[b"d"] for _, fields in entries))
        return surface.follows(meta.on_crash.encode(), last).decode()

    async def call(self, owner: str, op: str, conversation_id: str, args: dict | None = None,
                   wait_s: float = CALL_WAIT_S) -> dict | None:
        """Ask the node `owner` to do `op` on its stream; its answer, or None
        when no node listens under that name or it did not answer in time."""
        reply = P + "reply:" + secrets.token_hex(12)
        command = json.dumps({"op": op, "cid": conversation_id, "args": args or {}, "reply": reply})
        if not await self.redis.publish(P + "cmd:" + owner, command):
            return None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:  # short pops: each well inside the client's socket timeout
            left = max(0.1, deadline - time.monotonic())
            answer = await self.redis.blpop([reply], timeout=min(BLOCK_MS / 1000, left))
            if answer:
                return json.loads(answer[1])
        return None


class RemoteStream:
    """Another node's stream, read from Redis: what the routes and the chat
    read of a `log.Stream` (meta, offsets, `follow`), and a way to its owner."""

    def __init__(self, shared: Shared, meta: Meta, ctx: dict):
        self.shared, self.meta, self.ctx = shared, meta, ctx
        self.cap = shared.cap
        self.followers = 0
        self.context = None
        self.expired = False  # its keys are gone: nothing more can be read

    sid = property(lambda self: self.meta.sid)
    live = property(lambda self: self.meta.state == LIVE)
    start = property(lambda self: self.meta.start)
    end = property(lambda self: self.meta.end)
    check_offset = Stream.check_offset
    after_crash = Stream.after_crash

    async def refresh(self) -> None:
        fresh = _meta(await self.shared.redis.hgetall(P + "meta:" + self.sid))
        if fresh is None:  # expired: nothing more will come
            self.expired = True
            if self.live:
                self.meta.state = "interrupted"
            return
        if fresh.state == LIVE and not await self.shared.owner_alive(fresh.owner):
            fresh = await self.shared.end_orphan(fresh)
        self.meta = fresh

    async def call(self, op: str, args: dict | None = None, wait_s: float = CALL_WAIT_S) -> dict | None:
        return await self.shared.call(self.meta.owner, op, self.meta.conversation_id, args, wait_s)

    async def wait_ended(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while self.live and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            await self.refresh()
        return not self.live

    async def follow(self, offset: int) -> AsyncIterator[bytes]:
        """As `log.Stream.follow`: the bytes from `offset`, then live until it
        ends (or drops what this reader has not read: it reconnects, and
        `start` says where the stream now starts). A Redis error ends the
        reply where it is (the client reconnects `from=` what it has) rather
        than leaving it hanging."""
        try:
            async for data in self._follow(offset):
                yield data
        except Exception as exc:
            log.warning("following stream %s from Redis failed: %s", self.meta.conversation_id, exc)

    async def _follow(self, offset: int) -> AsyncIterator[bytes]:
        key = P + "data:" + self.sid
        redis = self.shared.redis
        last = f"{offset}-0"
        while True:
            entries = await redis.xrange(key, min="(" + last, count=64)
            for entry_id, fields in entries:
                last = entry_id.decode()
                end, data = int(last.split("-")[0]), fields[b"d"]
                if not data:  # the end marker
                    await self.refresh()
                    continue
                begins = end - len(data)
                if begins > offset:  # dropped under this reader (the cap)
                    await self.refresh()
                    return
                if end > offset:
                    yield data[offset - begins:]
                    offset = end
            if entries:
                continue
            if not self.live or self.expired:
                return
            if not await redis.xread({key: last}, block=BLOCK_MS, count=1):
                await self.refresh()
