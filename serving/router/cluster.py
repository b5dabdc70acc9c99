"""This web node's part in a cluster of routers (router mode with
HEARTH_REDIS_URL), as the manager's slots see it: the shared record
(`owners.py`), the other nodes as hosts a request is passed to (`peers`),
which node serves each library model that is served elsewhere (`held_by`),
and the heartbeat that keeps all three.

Runs on the server's event loop, like the manager: what it reads of Redis
takes effect between two awaits, and a claim it lets go is looked at again
when the drop runs. Without Redis (`owners` None) it holds nothing and
starts nothing."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from serving.router.owners import BEAT_S, Owners, Peer
from serving.router.remotes import RemoteHost
from serving.router.slots import Slot

log = logging.getLogger("hearth.router")


class Cluster:
    def __init__(self) -> None:
        self.owners: Owners | None = None  # the shared record, when `hearth serve` has Redis
        self.on_hop_key: Any = None  # called with the cluster's hop key once it is read
        self.peers: dict[str, RemoteHost] = {}  # the other nodes, as hosts, by node
        self.held_by: dict[str, str] = {}  # the library's models another node serves, by node
        self._task: asyncio.Task | None = None
        self._drops: set[asyncio.Task] = set()
        self._left = False

    @property
    def shared(self) -> bool:
        """Whether models are shared with other web nodes (Redis given)."""
        return self.owners is not None

    @property
    def hop_key(self) -> str | None:
        """The key nodes send each other, once read (None without Redis)."""
        return self.owners.hop_key if self.owners is not None else None

    # -- claims --------------------------------------------------------------
    async def claim(self, model: str) -> Peer | None:
        """None when `model` is this node's to load (now claimed); the peer that serves it otherwise."""
        assert self.owners is not None
        return await self.owners.claim(model)

    def peer_slot(self, slot: Slot, peer: Peer) -> Slot:
        """A library model another node serves: a slot forwarding there, made
        per request (it holds no process here and is never listed)."""
        host = self.peers.get(peer.node)
        if host is None or host.url != peer.url:
            host = self.peers[peer.node] = RemoteHost(peer.url, None, healthy=True, error=None, node=peer.node)
        self.held_by[slot.id] = peer.node
        return Slot(slot.entry, status="loaded", remote=host)

    def served_by(self, slot: Slot) -> dict | None:
        """The other web node that serves this library model, while it is not loaded here."""
        node = self.held_by.get(slot.id)
        host = self.peers.get(node) if node else None
        if host is None or slot.remote is not None or slot.status in ("loading", "loaded"):
            return None
        return {"node": node, "url": host.url}

    def let_go(self, model: str, still: Callable[[str], bool]) -> None:
        """This node's claim on `model` goes (Redis), unless `still(model)`
        when the drop runs (a reload may have begun by then)."""
        owners = self.owners
        if owners is None:
            return

        async def drop() -> None:
            if not still(model):
                await owners.drop(model)
        task = asyncio.ensure_future(drop())
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def forget(self, model: str, node: str) -> None:
        """`node` did not take a request for `model`: it is taken for gone,
        and its claim on the model goes (awaited)."""
        assert self.owners is not None
        self.held_by.pop(model, None)
        self.peers.pop(node, None)
        await self.owners.drop(model, node)

    # -- heartbeat -----------------------------------------------------------
    def start(self, look: Callable[[], Awaitable[None]]) -> None:
        """On the server's loop, with Redis: `look` (a `beat`, then
        `read_holders`) every owners.BEAT_S until this node leaves."""
        if self.owners is not None:
            self._task = asyncio.ensure_future(self._watch(look))

    async def _watch(self, look: Callable[[], Awaitable[None]]) -> None:
        while not self._left:
            try:
                await look()
            except Exception:  # never the end of this node's heartbeat
                log.exception("router ownership: looking at the other web nodes failed")
            await asyncio.sleep(BEAT_S)

    async def beat(self, holding: list[str], loaded: list[str], still: Callable[[str], bool]) -> None:
        """This node's record and claims renewed (Owners.beat), the other
        nodes read: each one a host whose models are its record's."""
        assert self.owners is not None
        if await self.owners.beat(holding, loaded, still) and self.on_hop_key is not None:
            self.on_hop_key(self.owners.hop_key)
        seen = self.owners.peers
        for node, record in seen.items():
            host = self.peers.get(node)
            if host is None or host.url != record["url"]:
                host = self.peers[node] = RemoteHost(record["url"], None, node=node)
            host.models, host.healthy, host.error, host.checked_at = record["models"], True, None, time.time()
        for node in [n for n in self.peers if n not in seen]:
            del self.peers[node]

    async def read_holders(self, models: list[str]) -> set[str]:
        """Which node serves each of the library's `models` (`held_by`); the ids whose node changed."""
        assert self.owners is not None
        held = await self.owners.owners(models)
        changed = {m for m in {*held, *self.held_by} if held.get(m) != self.held_by.get(m)}
        self.held_by = held
        return changed

    def leave(self, holding: list[str]) -> None:
        """At shutdown (the drain's start, on the loop): this node's record
        and its claims on `holding` go, so the other nodes load what it served."""
        if self.owners is None or self._left:
            return
        self._left = True
        if self._task is not None:
            self._task.cancel()
        self.owners.leave(holding)
