"""Which models are loaded, in which process, and what may load next.

Runs on the server's event loop: every decision about a slot happens
between two awaits, so it is atomic without a lock; the one lock orders
loads, so capacity is checked, a victim evicted and the new slot
reserved as one step (many requests for different models never load more
than `models_max`, and two requests for one model start one process).

A slot's life: unloaded -> loading -> loaded -> (unloading) -> unloaded,
or loading -> failed. A child that exits, however it exits, leaves its
slot unloaded (failed when it never became ready), its waiters and
in-flight requests get an error, and the next request loads it again.

Models other machines serve become slots through `RemoteHosts`
(remote_hosts.py), and, with Redis, which web node serves each model is
`Cluster`'s (cluster.py): both run on the same loop, and the manager
decides with what they hold. The life of each model's process (started,
ready, exited, drained and stopped) is its base's, `Processes`
(processes.py).
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable

from serving.router import presets, remote_hosts
from serving.router.catalog import DEFAULT_WORDS, Catalog, Entry, Library
from serving.router.cluster import Cluster
from serving.router.processes import Processes
from serving.router.remote_hosts import RemoteHosts
from serving.router.remotes import RemoteHost
from serving.router.slots import (
    Downloading,
    LoadFailed,
    ModelNotFound,
    NoCapacity,
    NotEnoughMemory,
    RemoteModel,
    RouterError,
    Settings,
    Slot,
    available_memory,
    gib,
    held,
)

log = logging.getLogger("hearth.router")
SCAN_S = 5  # seconds between looks at the library (downloads, `hearth rm`, new folders)
FAILED_RETRY_S = 60.0  # a model whose load failed is tried again by a request no sooner (POST /models/load: at once)
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
MakeWay = Callable[[], Awaitable[None]]


class Manager(Processes):
    def __init__(self, library: Library, settings: Settings, default: str | None, usable_bytes: int,
                 catalog: Catalog | None = None, remotes: list[RemoteHost] | None = None):
        super().__init__(settings, usable_bytes)
        self.library = library
        self.catalog: Catalog = catalog if catalog is not None else library.scan(strict=True)
        self.remote_hosts = RemoteHosts(remotes or [])  # --models-remote hosts' models as slots
        self.cluster = Cluster()  # with Redis: which web node serves each model (its `owners` set by serve)
        self._sync_slots()
        self._sync_remotes()
        self._lock: asyncio.Lock | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._idle_task: asyncio.Task | None = None
        # Models a build will publish into the library (the demo model), and what a request that names one is
        # told until it is there: a 503 that says why it waits, not a 400 that the model does not exist.
        self.coming: dict[str, str] = {}
        # The model a request that names none gets; None: such a request is refused with the list.
        self.default: str | None = None
        self.default = self.resolve(default).id if default else None
        self.no_default_note = ""  # said with that refusal (a demo model being trained, say)

    # -- names ---------------------------------------------------------------
    def _sync_slots(self) -> list[Slot]:
        """Slots for the catalog's models (the new ones returned); a model
        gone from disk loses its slot once nothing runs or waits on it."""
        added = []
        for model_id, entry in self.catalog.entries.items():
            slot = self.slots.get(model_id)
            if slot is None:
                slot = self.slots[model_id] = Slot(entry, pinned=bool(entry.preset.pinned))
                added.append(slot)
            else:
                slot.entry = entry
        for model_id in [m for m in self.fetching if m in self.catalog.entries]:
            del self.fetching[model_id]  # downloaded: the library has it now
        for model_id in [m for m, s in self.slots.items()
                         if m not in self.catalog.entries and m not in self.fetching and s.remote is None]:
            slot = self.slots[model_id]
            if slot.status in ("unloaded", "failed") and not slot.users and slot.child is None:
                del self.slots[model_id]  # removed from disk and not running
        return added

    def _sync_remotes(self) -> list[Slot]:
        """Slots for what the remote hosts and the other web nodes serve (the changed ones returned)."""
        return self.remote_hosts.sync(self.slots, self.catalog.entries, self.cluster.peers.values())

    def _remotes_changed(self) -> None:
        """What the hosts hold now, taken in: each slot it changed announced."""
        for slot in self._sync_remotes():
            self._changed(slot)

    def hop_headers(self, slot: Slot) -> dict:
        """The credentials (and, to another web node, the hop's mark) a request forwarded to `slot` carries."""
        return remote_hosts.hop_headers(slot, self.key, self.cluster.hop_key)

    def remote_down(self, slot: Slot, message: str) -> None:
        """A forwarded request found the remote host gone: marked failed until the next look says otherwise."""
        if slot.remote is not None and slot.remote.healthy:
            slot.remote.healthy, slot.remote.error = False, message
            self._remotes_changed()

    async def peer_gone(self, slot: Slot) -> None:
        """Another web node did not take a request for `slot`'s model: its
        claim goes (awaited), so the next acquire takes it or finds another node."""
        if not self.cluster.shared or slot.remote is None or slot.remote.node is None:
            return
        await self.cluster.forget(slot.id, slot.remote.node)
        self._remotes_changed()

    async def take_over(self, name: str | None, gone: Slot) -> Slot:
        """`gone`'s node did not take a request for `name`: the model loads
        here (claimed, or found on a third node by the next request)."""
        await self.peer_gone(gone)
        try:
            return await self.acquire(name, hop=True)
        except ModelNotFound:  # only that node's library had it
            raise RouterError(f"model {gone.id!r} was served by the web node at {gone.url}, which is gone or "
                              f"stopping; no other node has it") from None

    async def refresh(self) -> None:
        """Scan the library again (off the event loop: it reads every model's
        headers) and take in what appeared or went (a download, `hearth rm`)."""
        try:
            catalog = await asyncio.to_thread(self.library.scan)
        except Exception:  # a half-written download must not break the router
            log.exception("rescanning the library failed")
            return
        self.catalog = catalog
        for slot in self._sync_slots() + self._sync_remotes():
            self._changed(slot)

    def resolve(self, name: str | None, fetch: bool = False) -> Entry:
        """The entry `name` (an id or alias; None or "default": the default
        model) stands for. With `fetch`, a repo id the library lacks becomes
        an entry whose process downloads it first."""
        if name is None or (isinstance(name, str) and name.strip() in DEFAULT_WORDS):
            name = getattr(self, "default", None)
            if name is None:
                raise self._no_default()
        if not isinstance(name, str):
            raise ModelNotFound("model must be a string naming a model; GET /v1/models lists the models")
        entry = self.catalog.resolve(name) or self.fetching.get(name) or self.remote_hosts.entries.get(name)
        if entry is None and name in self.coming:
            raise RouterError(f"model {name!r} is not in the library yet: {self.coming[name]}")
        if entry is None and fetch and REPO_ID.fullmatch(name) and not self.settings.isolated:
            entry = Entry(id=name, ref=name, preset=presets.merged(self.library.table, name))
            self.fetching[name] = entry
            self.slots.setdefault(name, Slot(entry))
        if entry is None:
            raise ModelNotFound(f"model {name!r} not found; GET /v1/models lists the models")
        return entry

    def _no_default(self) -> RouterError:
        """The refusal of a request that names no model while there is no
        default: a 400 that lists the models it may name, or, while the demo
        model trains towards its first checkpoint, a 503 that says so."""
        names = sorted(set(self.catalog.entries) | set(self.remote_hosts.entries))
        listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        which = f"name one of: {listed}" if names else "the library has none yet (`hearth pull REPO`)"
        if self.no_default_note:
            return RouterError(f"no model was named and the default model is not ready: {self.no_default_note}"
                               + (f"; or name one of: {listed}" if names else ""))
        return ModelNotFound(f"no model was named and this server has no default model; {which} "
                             "(GET /v1/models lists them; `hearth serve --default-model` sets one)")

    # -- rows ----------------------------------------------------------------
    def _changed(self, slot: Slot) -> None:
        self._emit("model", self.row(slot))

    def row(self, slot: Slot) -> dict:
        entry = slot.entry
        now = time.time()
        loaded = slot.status == "loaded"
        return {
            "id": entry.id, "object": "model", "aliases": list(entry.aliases), "tags": list(entry.tags),
            "pinned": slot.pinned, "default": entry.id == self.default, "status": slot.status_object(),
            "memory_bytes": slot.child.rss_bytes() if loaded and slot.child is not None else None,
            "estimated_bytes": entry.estimated_bytes(self.usable_bytes), "size_bytes": entry.size_bytes,
            "quant_bits": entry.quant_bits,
            "fits": (entry.estimated_bytes(self.usable_bytes) or 0) <= self.usable_bytes
            if entry.weights_bytes else None,
            "last_used": slot.last_used, "loaded_at": slot.loaded_at if loaded else None,
            "idle_s": round(now - slot.last_used, 1) if loaded and slot.last_used and not slot.users else
            (0.0 if loaded else None),
            "inflight": slot.users - slot.loaders, "pid": slot.child.pid if slot.child is not None else None,
            "remote": slot.remote.status() if slot.remote is not None else None,
            "served_by": self.cluster.served_by(slot),
        }

    def rows(self) -> list[dict]:
        return [self.row(s) for s in list(self.slots.values())]

    def loaded_here(self) -> list[Slot]:
        """The loaded models but other web nodes' (what a fan-out asks: a
        node never asks another, so two nodes never ask each other in turn)."""
        return [s for s in self.loaded() if s.remote is None or s.remote.node is None]

    def loaded(self) -> list[Slot]:
        """The models answering now: local children, and remote hosts that answered the last look."""
        return [s for s in self.slots.values() if s.status == "loaded" and (s.port is not None or s.remote)]

    # -- use -----------------------------------------------------------------
    async def acquire(self, name: str | None, fetch: bool = False, hop: bool = False,
                      make_way: MakeWay | None = None, loader: bool = False) -> Slot:
        """The slot serving `name`, loaded; the caller must `release` it.
        With Redis, a model another web node serves is passed to it, unless
        this request came from another node (`hop`): that one is served here.
        `make_way()` is awaited once if the load must wait for a busy model to
        go (the caller may end what it holds elsewhere). A `loader` holds the
        slot for a load alone (`load`): not counted as a request in flight."""
        slot = self.slots[self.resolve(name, fetch).id]
        if slot.remote is not None and slot.remote.node is not None and hop:
            raise RouterError(f"model {slot.id!r} is not loaded on this node any more; send the request again")
        if (self.cluster.shared and slot.remote is None and slot.status in ("unloaded", "failed")
                and not slot.users and slot.id not in self.fetching):
            peer = await self.cluster.claim(slot.id)  # None: claimed, ours to load
            if peer is not None and not hop and slot.status in ("unloaded", "failed") and not slot.users:
                slot = self.cluster.peer_slot(slot, peer)
        if slot.remote is not None:  # loaded or not by its own host, never from here
            if slot.status != "loaded":
                raise RouterError(f"model {slot.id!r} is served by {slot.remote.url}, which does not answer: "
                                  f"{slot.remote.error}")
            slot.users += 1
            slot.loaders += loader
            slot.last_used = time.time()
            return slot
        if not loader and slot.status == "failed" and slot.failed_at is not None:
            ago = time.monotonic() - slot.failed_at
            if ago < FAILED_RETRY_S:  # a client retrying would start a process, and evict another model, each time
                self._let_go(slot)
                raise LoadFailed(f"model {slot.id!r} failed to load {ago:.0f}s ago: {slot.error}; a request loads it "
                                 f"again {FAILED_RETRY_S:g}s after a failure (POST /models/load at once)")
        slot.users += 1
        slot.loaders += loader
        try:
            if slot.status != "loaded" or slot.unloading:
                await self._load(slot, make_way)
        except BaseException:
            slot.users -= 1
            slot.loaders -= loader
            self._wake()
            if slot.status not in ("loading", "loaded") and not slot.users:
                self._let_go(slot)
            raise
        slot.last_used = time.time()
        return slot

    def _let_go(self, slot: Slot) -> None:
        """This node's claim on a model it no longer loads or serves goes (Redis)."""
        if slot.remote is None and self.slots.get(slot.id) is slot:
            self.cluster.let_go(slot.id, self._holds)

    def _holds(self, model: str) -> bool:
        """Whether `model` loads, runs or waits for room here (its claim is kept)."""
        slot = self.slots.get(model)
        return (slot is not None and slot.remote is None and model not in self.fetching and slot.fetch is None
                and (slot.status in ("loading", "loaded") or slot.users > 0))

    def release(self, slot: Slot) -> None:
        slot.users = max(0, slot.users - 1)
        slot.last_used = time.time()
        if not slot.users:
            self._wake()  # a load waiting for a slot may evict this one now

    async def load(self, name: str | None, fetch: bool = False) -> Slot:
        slot = await self.acquire(name, fetch, loader=True)
        slot.loaders -= 1
        self.release(slot)
        return slot

    async def _load(self, slot: Slot, make_way: MakeWay | None = None) -> None:
        if self._lock is None:
            self._lock, self._released = asyncio.Lock(), asyncio.Event()
        if slot.id in self.fetching:  # not in the library yet: download first, taking no model slot
            await self._download(slot)
        deadline = time.monotonic() + self.settings.slot_wait_s
        while slot.status != "loaded" or slot.unloading:
            if slot.status == "loading":
                await self._wait_ready(slot)
                continue
            room = True
            async with self._lock:
                if slot.status == "loaded" and not slot.unloading:
                    return
                if slot.unloading:
                    await self._wait_exit(slot)
                if slot.status in ("unloaded", "failed"):
                    if self.stopping:  # a load that waited through the shutdown starts nothing
                        raise RouterError("the server is shutting down")
                    room = await self._make_room(slot, deadline)
                    if room and not self.stopping:
                        self._start(slot)  # reserved: counted as loading before the lock is let go
            if not room:  # every model is busy: wait, without the lock, for one to finish a request
                if make_way is not None:
                    await make_way()
                    make_way = None
                    continue
                await self._next_release(deadline)
                continue
            await self._wait_ready(slot)

    async def _make_room(self, slot: Slot, deadline: float) -> bool:
        """Evict least-recently-used idle models until one more fits the cap
        and, by estimate, the free memory. False: every candidate is busy,
        wait for a release and try again; refused when none can ever go."""
        cap = self.settings.models_max
        need = slot.entry.estimated_bytes(self.usable_bytes)
        if need and need > self.usable_bytes:
            raise NotEnoughMemory(f"cannot load {slot.id!r}: it needs about {gib(need)}, more than the "
                                  f"{gib(self.usable_bytes)} a model may take on this machine")
        while True:
            # A download holds no slot and no memory yet; a load in progress will soon hold its estimate.
            active = [s for s in self.slots.values()
                      if s is not slot and s.status in ("loading", "loaded") and s.fetch is None and s.remote is None]
            short = self._memory_short(need, active)
            if len(active) < cap and not short:
                return True
            if short and need and need > (self._free(active) or 0) + sum(held(s) for s in active if not s.pinned):
                raise NotEnoughMemory(f"cannot load {slot.id!r}: it needs about {gib(need)} and only "
                                      f"{gib(self._free(active))} of memory is free, even with every unpinned "
                                      f"model unloaded; free memory first")  # nothing is unloaded in vain
            victims = sorted((s for s in active if s.status == "loaded" and not s.users and not s.pinned),
                             key=lambda s: s.last_used or 0)
            if not victims:
                # A busy or loading model that is not pinned can go once its requests end.
                if any(not s.pinned for s in active) and time.monotonic() < deadline:
                    assert self._released is not None
                    self._released.clear()  # set again by the next request that ends
                    return False
                if len(active) >= cap:
                    busy = ", ".join(sorted(s.id for s in active))
                    raise NoCapacity(f"cannot load {slot.id!r}: all {cap} model slots (--models-max) are busy or "
                                     f"pinned ({busy}); try again when one is idle, unload one with POST "
                                     f"/models/unload, or start the server with a higher --models-max")
                raise NotEnoughMemory(f"cannot load {slot.id!r}: it needs about {gib(need)} and only "
                                      f"{gib(self._free(active))} of memory is free; unload a model "
                                      f"(POST /models/unload) or free memory first")
            log.info("unloading %s (least recently used) to load %s", victims[0].id, slot.id)
            await self._stop(victims[0])

    async def _next_release(self, deadline: float) -> None:
        assert self._released is not None
        try:
            await asyncio.wait_for(self._released.wait(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            pass

    def _free(self, active: list[Slot]) -> int | None:
        """Free memory, less what loads in progress are about to take (each
        one's estimate, less what its process already holds)."""
        free = available_memory()
        if free is None:
            return None
        for s in active:
            if s.status == "loading":
                expected = s.entry.estimated_bytes(self.usable_bytes) or 0
                held = s.child.rss_bytes() or 0 if s.child is not None else 0
                free -= max(0, expected - held)
        return free

    def _memory_short(self, need: int | None, active: list[Slot]) -> bool:
        if not self.settings.memory_check or not need:
            return False
        free = self._free(active)
        return free is not None and need > free

    # -- unload --------------------------------------------------------------
    async def unload(self, name: str | None) -> Slot:
        """Stop the model's process. A load in progress is ended (the
        requests waiting for it get `LoadCalledOff`); a download is refused."""
        slot = self.slots[self.resolve(name).id]
        if slot.remote is not None:
            raise RemoteModel(f"model {slot.id!r} is served by {slot.remote.url}: unload it there")
        if slot.fetch is not None:
            raise Downloading(f"model {slot.id!r} is being downloaded ({slot.percent}%); unload it once it has "
                              "loaded (GET /models/sse shows the progress)")
        if slot.status == "loading":
            slot.called_off = slot.ready
        if slot.status in ("loaded", "loading"):
            await self._stop(slot)
        return slot

    def set_pinned(self, name: str | None, pinned: bool) -> Slot:
        slot = self.slots[self.resolve(name).id]
        slot.pinned = pinned
        self._changed(slot)
        return slot

    def set_default(self, name: str | None) -> Entry:
        entry = self.resolve(name)
        old = self.default
        self.default = entry.id
        for model_id in {old, entry.id}:
            if model_id in self.slots:
                self._changed(self.slots[model_id])
        return entry

    # -- background ----------------------------------------------------------
    def start(self, preload: list[str]) -> None:
        """On the server's loop: the idle sweep, and the models to load now."""
        self.loop = asyncio.get_running_loop()
        self._idle_task = asyncio.ensure_future(self._sweep())
        self.remote_hosts.start(self.client, self._remotes_changed)
        self.cluster.start(self._look_at_peers)
        for name in preload:
            asyncio.ensure_future(self._preload(name))

    def _here(self) -> tuple[list[str], list[str]]:
        """The models this node holds a claim on, and those it serves now."""
        return ([m for m in self.slots if self._holds(m)],
                [m for m, s in self.slots.items() if s.remote is None and s.status == "loaded" and not s.unloading])

    async def _look_at_peers(self) -> None:
        """One heartbeat (with Redis): this node's record and claims renewed,
        the other nodes read (their models join the list as remote ones)."""
        await self.cluster.beat(*self._here(), self._holds)
        changed = await self.cluster.read_holders(list(self.catalog.entries))
        for slot in self._sync_remotes() + [self.slots[m] for m in changed if m in self.slots]:
            self._changed(slot)

    def leave(self) -> None:
        """At shutdown (the drain's start, on the loop): this node's record
        and claims go, so the other nodes load what it served."""
        self.stopping = True
        self.cluster.leave(self._here()[0])

    async def _preload(self, name: str) -> None:
        try:
            await self.load(name)
        except RouterError as exc:
            log.warning("preloading %s: %s", name, exc.message)

    async def _sweep(self) -> None:
        """Every second: unload idle models; every SCAN_S: look at the library again."""
        ticks = 0
        while True:
            await asyncio.sleep(1.0)
            ticks += 1
            if ticks % SCAN_S == 0:
                await self.refresh()
            now = time.time()
            for slot in list(self.slots.values()):
                if slot.remote is not None:
                    continue
                limit = slot.entry.preset.idle_unload
                limit = self.settings.idle_unload_s if limit is None else limit
                if (limit and slot.status == "loaded" and not slot.users and not slot.pinned
                        and not slot.unloading and now - (slot.last_used or now) >= limit):
                    asyncio.ensure_future(self._idle_stop(slot, limit))

    async def _idle_stop(self, slot: Slot, limit: float) -> None:
        idle = time.time() - (slot.last_used or time.time())
        # Checked again here, where nothing can come between the check and the stop.
        if slot.status != "loaded" or slot.users or slot.pinned or slot.unloading or idle < limit:
            return
        log.info("unloading %s: idle for %.0fs (--idle-unload)", slot.id, idle)
        await self._stop(slot)
