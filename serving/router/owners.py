"""Which web node serves each model, shared through Redis (router mode with
HEARTH_REDIS_URL).

Several `hearth serve` routers behind one port each start their own model
processes. Left alone, each would load every model it is asked for: a
second copy of a model on one machine, or one load paid on every node.
With this record, the first node asked for a model claims it and loads it;
the others pass requests for it to that node's router (its advertised URL,
with the cluster's hop key), as they pass them to a `--models-remote` host,
until it unloads the model or its heartbeat stops. A request that arrives
by such a hop is served where it lands, so two nodes never pass one request
back and forth.

Keys:
- `hearth:router:node:<node>`: `{"url", "models"}` (JSON; the models it has
  loaded), expires after `NODE_TTL_S`, renewed every `BEAT_S`; the set
  `hearth:router:nodes` names them (a name whose record expired is removed
  by the next node that reads it).
- `hearth:router:owner:<model id>`: the node that loads or serves it. Taken
  only when free or when its node's heartbeat is gone (`CLAIM`), renewed by
  its node's beat while the model loads or runs there, deleted by that node
  when the model stops (`DROP`, only while it is still the owner).
- `hearth:router:hop-key`: the key nodes send each other (made by the first
  node, and made again by the next beat if Redis loses it; each node with
  keys of its own accepts it, and a request only counts as passed on by
  another node when it carries it).

A Redis that is away never fails a request: a node that cannot read or take
a claim loads the model itself, as one router alone would.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.surfaces import DRAINING_HEADER
from serving.streams.shared import fail_fast_client

log = logging.getLogger("hearth.router")

P = "hearth:router:"
NODE_TTL_S = 15
BEAT_S = 5.0
HOP_HEADER = "x-hearth-hop"  # on a request one node passes to another: serve it there, never pass it on
MODEL_HEADER = "x-hearth-model"  # with it: the model id as the passing node resolved the request's name

# KEYS: owner:<model>. ARGV: node, ttl, node key prefix. Returns the owner after the call.
CLAIM = r"""
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] and redis.call('EXISTS', ARGV[3] .. owner) == 1 then return owner end
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
return ARGV[1]
"""

# KEYS: owner:<model>. ARGV: the node that lets it go.
DROP = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def refused_hop(reply: Any) -> bool:
    """Whether another node's answer means it did not take the request: it
    drains (its 503 says so), or it refused the hop's key or this Host (a
    misconfigured node). Its other errors (a model it cannot load, a busy
    engine) are the client's answer, as from any process."""
    return reply.status_code in (401, 403) or (reply.status_code == 503 and bool(reply.headers.get(DRAINING_HEADER)))


@dataclass(frozen=True)
class Peer:
    node: str
    url: str


class Owners:
    """This node's side of the record: its claims, its heartbeat and what it reads of the others."""

    def __init__(self, url: str, node: str, advertise: str):
        import redis.asyncio as aioredis

        self.url, self.node, self.advertise = url, node, advertise
        self.redis: Any = fail_fast_client(aioredis, url)
        self.hop_key: str | None = None
        self.peers: dict[str, dict] = {}  # node -> its record (url, models), as of the last beat
        self.read_at = 0.0  # when the others were last read (monotonic)
        self._claim = self.redis.register_script(CLAIM)
        self._drop = self.redis.register_script(DROP)
        self._failing = False

    # -- start ---------------------------------------------------------------
    def read_hop_key(self) -> str | None:
        """The cluster's hop key, made here if no node made it yet (blocking: at start)."""
        import redis

        client = fail_fast_client(redis, self.url)
        try:
            client.set(P + "hop-key", secrets.token_urlsafe(32), nx=True)
            value = client.get(P + "hop-key")
        except redis.RedisError as exc:
            log.warning("router ownership: Redis cannot be reached (%s); models load here until it can", exc)
            return None
        finally:
            client.close()
        self.hop_key = value.decode() if isinstance(value, bytes) else value
        return self.hop_key

    async def beat(self, holding: list[str], loaded: list[str], still: Callable[[str], bool]) -> bool:
        """Renew this node's record (`loaded`: what it serves) and its claims
        (`holding`: what loads, runs or waits for room here; each renewed only
        if `still(model)` right before), and read the other nodes'. True when
        the hop key changed (read for the first time, or made again by a node
        after Redis lost it: this node then accepts and sends that one)."""
        changed = False
        try:
            await self.redis.set(P + "hop-key", self.hop_key or secrets.token_urlsafe(32), nx=True)
            value = await self.redis.get(P + "hop-key")
            value = value.decode() if isinstance(value, bytes) else value
            if value and value != self.hop_key:
                self.hop_key, changed = value, True
            record = json.dumps({"url": self.advertise, "models": loaded})
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(P + "node:" + self.node, record, ex=NODE_TTL_S)
                pipe.sadd(P + "nodes", self.node)
                await pipe.execute()
            for model in holding:  # still ours, unless another node took it while this loop stalled
                if still(model):
                    await self._claim(keys=[P + "owner:" + model], args=[self.node, NODE_TTL_S, P + "node:"])
            self.peers, self.read_at = await self._read_peers(), time.monotonic()
            self._ok()
        except Exception as exc:  # noqa: BLE001 - any Redis trouble: models load here meanwhile
            self._failed(exc)
            if time.monotonic() - self.read_at > NODE_TTL_S:
                self.peers = {}  # not seen for as long as a record lives: taken for gone
        return changed

    async def _read_peers(self) -> dict[str, dict]:
        """The live nodes' records (a node whose record expired leaves the set here)."""
        names = sorted(n.decode() if isinstance(n, bytes) else n for n in await self.redis.smembers(P + "nodes"))
        names = [n for n in names if n != self.node]
        raws = await self.redis.mget([P + "node:" + n for n in names]) if names else []
        out, gone = {}, []
        for name, raw in zip(names, raws, strict=True):
            try:
                record = json.loads(raw) if raw else None
            except ValueError:
                record = None
            if not isinstance(record, dict) or not isinstance(record.get("url"), str):
                gone.append(name)
                continue
            models = record.get("models")
            out[name] = {"url": record["url"], "models": [m for m in models or [] if isinstance(m, str)]}
        if gone:
            await self.redis.srem(P + "nodes", *gone)
        return out

    # -- claims --------------------------------------------------------------
    async def claim(self, model: str) -> Peer | None:
        """None when `model` is this node's to load (now claimed); the peer that serves it otherwise."""
        try:
            owner = await self._claim(keys=[P + "owner:" + model], args=[self.node, NODE_TTL_S, P + "node:"])
            owner = owner.decode() if isinstance(owner, bytes) else owner
            if owner == self.node:
                return None
            raw = await self.redis.get(P + "node:" + owner)
            record = json.loads(raw) if raw else None
        except Exception as exc:  # noqa: BLE001 - Redis away or a bad record: load it here
            self._failed(exc)
            return None
        self._ok()
        if not isinstance(record, dict) or not isinstance(record.get("url"), str):
            return None
        return Peer(owner, record["url"])

    async def owners(self, models: list[str]) -> dict[str, str]:
        """Which node holds each of `models` (those held by another node only)."""
        if not models:
            return {}
        try:
            values = await self.redis.mget([P + "owner:" + m for m in models])
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
            return {}
        out = {}
        for model, value in zip(models, values, strict=True):
            value = value.decode() if isinstance(value, bytes) else value
            if value and value != self.node:
                out[model] = value
        return out

    async def drop(self, model: str, node: str | None = None) -> None:
        """Let `model` go (this node's claim, or `node`'s when that node was found gone)."""
        try:
            await self._drop(keys=[P + "owner:" + model], args=[node or self.node])
        except Exception as exc:  # noqa: BLE001 - it expires by itself within NODE_TTL_S
            self._failed(exc)

    def leave(self, held: list[str]) -> None:
        """At shutdown (blocking): this node's record and claims go at once,
        so the others load what it served instead of passing requests to it."""
        import redis

        client = fail_fast_client(redis, self.url)
        try:
            client.delete(P + "node:" + self.node)
            client.srem(P + "nodes", self.node)
            for model in held:
                client.eval(DROP, 1, P + "owner:" + model, self.node)
        except redis.RedisError as exc:  # they expire by themselves within NODE_TTL_S
            log.warning("router ownership: could not let go of this node's models (%s)", exc)
        finally:
            client.close()

    def _failed(self, exc: Exception) -> None:
        if not self._failing:
            log.warning("router ownership: Redis failed (%s: %s); models load here until it answers",
                        type(exc).__name__, exc)
        self._failing = True

    def _ok(self) -> None:
        if self._failing:
            log.info("router ownership: Redis answers again")
        self._failing = False
