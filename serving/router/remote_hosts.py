"""The models other machines serve, as the manager's slots: each
`--models-remote` host's (looked at every `remotes.CHECK_S`; one host and
its look: `remotes.py`) and each other web node's (read by `cluster.py`),
one slot per id, "loaded" while its host answers, and the credentials a
request forwarded to any slot carries.

Runs on the server's event loop, like the manager: `sync` decides about
the slots between two awaits."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from serving.router import presets, remotes
from serving.router.catalog import Entry
from serving.router.owners import HOP_HEADER, MODEL_HEADER
from serving.router.remotes import RemoteHost
from serving.router.slots import Slot


class RemoteHosts:
    def __init__(self, hosts: list[RemoteHost]):
        self.hosts: list[RemoteHost] = list(hosts)  # --models-remote, in the order given
        self.entries: dict[str, Entry] = {}  # the ids remote hosts serve, the library lacks
        self._task: asyncio.Task | None = None

    def sync(self, slots: dict[str, Slot], library: dict[str, Entry], peers: Iterable[RemoteHost]) -> list[Slot]:
        """Slots in `slots` for what the hosts and the other web nodes
        (`peers`) serve, loaded while their host answers (the changed ones
        returned). An id the `library` has, or a local process still holds,
        stays local; of two hosts, the first serves it."""
        changed = []
        claimed: set[str] = set()
        for host in [*self.hosts, *peers]:
            for model_id in host.models:
                slot = slots.get(model_id)
                if model_id in library or model_id in claimed or (slot and slot.remote is None):
                    continue
                claimed.add(model_id)
                if slot is None:
                    entry = Entry(id=model_id, ref=host.url, preset=presets.Preset(model_id, "", tags=("remote",)))
                    self.entries[model_id] = entry
                    slot = slots[model_id] = Slot(entry)
                status, error = ("loaded", None) if host.healthy else ("failed", f"remote {host.url}: {host.error}")
                if (slot.remote, slot.status, slot.error) != (host, status, error):
                    slot.remote, slot.status, slot.error = host, status, error
                    changed.append(slot)
        for model_id in [m for m, s in slots.items() if s.remote is not None and m not in claimed]:
            slot = slots[model_id]  # its host serves it no more, or the library has it now
            if model_id in library and not slot.users:
                del self.entries[model_id]
                slots[model_id] = Slot(library[model_id])
            elif slot.remote is not None and slot.remote.node is not None and not slot.users:
                # another web node unloaded it: no longer listed here
                del self.entries[model_id], slots[model_id]
            elif slot.status != "failed":
                slot.status, slot.error = "failed", f"remote {slot.url} no longer serves it"
                changed.append(slot)
        return changed

    def start(self, client: Callable[[], Any], on_change: Callable[[], None]) -> None:
        """On the server's loop: every remotes.CHECK_S, each host's health,
        models and capacity (through `client()`, the manager's pool);
        `on_change` when any of them changed."""
        if self.hosts:
            self._task = asyncio.ensure_future(self._watch(client, on_change))

    async def _watch(self, client: Callable[[], Any], on_change: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(remotes.CHECK_S)
            pool = client()
            results = await asyncio.gather(*(host.probe(pool) for host in self.hosts), return_exceptions=True)
            if any(r is True for r in results):
                on_change()


def hop_headers(slot: Slot, key: str, hop_key: str | None) -> dict:
    """The credentials a request forwarded to `slot` carries: the remote
    host's key, another node's `hop_key` (the cluster's), or `key` (what the
    local children accept); and, to another web node, the mark that it is
    served there and not passed on. A remote host run without a key gets no
    `Authorization` at all (an empty `Bearer ` is a malformed header its
    server refuses)."""
    if slot.remote is not None:
        key = (hop_key if slot.remote.node else slot.remote.key) or ""
    out = {"authorization": f"Bearer {key}"} if key else {}
    if slot.remote is not None and slot.remote.node is not None:  # the id as resolved here (aliases,
        out[HOP_HEADER], out[MODEL_HEADER] = "1", slot.id  # the default may differ there)
    return out
