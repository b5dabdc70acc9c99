"""Model hosts on other machines (`hearth serve --models-remote URL`).

A remote host is another `hearth serve` (one model, or a router of its
own). The router looks at each one every `CHECK_S`: `/health`, then
`/v1/models` for the ids it serves and `/fit` for what it can hold (the
context it can keep and its decode speed), with the hop's key
(`--models-remote-key`; never the router's own, which its clients hold). Each id becomes a slot
that is "loaded" while its host answers and "failed", with the reason,
while it does not; requests for it are forwarded there like a local
child's, the key replaced by the hop's. A remote model is never loaded,
unloaded or evicted from here, and does not count against `--models-max`
(its memory is its host's). An id the library already has stays local;
of two hosts serving one id, the first one given serves it."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

log = logging.getLogger("hearth.router")
CHECK_S = 5.0
PROBE_TIMEOUT_S = 5.0


class RemoteUrlError(ValueError):
    pass


def checked_url(raw: str, flag: str = "--models-remote") -> str:
    """`raw` as a base URL (scheme and host, no path beyond `/`), or RemoteUrlError."""
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteUrlError(f"{flag} {raw!r}: give a URL such as http://host:8080")
    if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise RemoteUrlError(f"{flag} {raw!r}: give the server's base URL only (no path, query or "
                             "credentials; a key goes in its own flag)")
    return f"{parts.scheme}://{parts.netloc}"


@dataclass
class RemoteHost:
    url: str
    key: str | None
    healthy: bool = False
    error: str | None = "not checked yet"
    models: list[str] = field(default_factory=list)
    capacity: dict = field(default_factory=dict)  # from its /fit: context_tokens, decode_tps, model
    checked_at: float | None = None
    node: str | None = None  # another web node of this cluster (serving/router/owners.py), not a --models-remote


    def headers(self) -> dict:
        return {"authorization": f"Bearer {self.key}"} if self.key else {}

    def status(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "error": self.error, "capacity": self.capacity or None,
                "checked_at": self.checked_at, "node": self.node}

    async def probe(self, client: httpx.AsyncClient) -> bool:
        """Look at the host again; True when what it serves or its health changed."""
        before = (self.healthy, tuple(self.models), self.error)
        try:
            health = await client.get(self.url + "/health", timeout=PROBE_TIMEOUT_S)
            if health.status_code != 200:
                raise _Down(f"/health answered {health.status_code}")
            listing = await client.get(self.url + "/v1/models", headers=self.headers(), timeout=PROBE_TIMEOUT_S)
            if listing.status_code in (401, 403):
                raise _Down(f"it refused the key ({listing.status_code}): check --models-remote-key")
            if listing.status_code != 200:
                raise _Down(f"/v1/models answered {listing.status_code}")
            ids = [row["id"] for row in listing.json().get("data") or [] if isinstance(row.get("id"), str)]
            self.capacity = await self._capacity(client) or self.capacity  # a slow /fit keeps the last
            self.models, self.healthy, self.error = ids, True, None
        except (httpx.HTTPError, ValueError, AttributeError, _Down) as exc:
            self.healthy = False
            self.error = str(exc) if isinstance(exc, _Down) else f"unreachable ({type(exc).__name__}: {exc})"
        self.checked_at = time.time()
        return before != (self.healthy, tuple(self.models), self.error)

    async def _capacity(self, client: httpx.AsyncClient) -> dict:
        """What the host's /fit says of the model it has loaded ({} when it says nothing)."""
        try:
            reply = await client.get(self.url + "/fit", headers=self.headers(), timeout=PROBE_TIMEOUT_S)
            body = reply.json() if reply.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}
        if not isinstance(body, dict):
            return {}
        machine = body.get("machine")
        machine = machine if isinstance(machine, dict) else {}
        return {"model": body.get("model"), "context_tokens": body.get("context_tokens"),
                "decode_tps": body.get("measured_decode_tps") or body.get("typical_decode_tps"),
                "chip": machine.get("chip"), "usable_bytes": machine.get("usable_bytes")}


class _Down(Exception):
    pass


def probe_all(hosts: list[RemoteHost]) -> None:
    """Look at every host once, blocking (at start, so `--default-model` may name a remote model)."""
    async def run():
        async with httpx.AsyncClient() as client:
            await asyncio.gather(*(host.probe(client) for host in hosts))
    asyncio.run(run())
    for host in hosts:
        if host.healthy:
            log.info("remote %s serves %s", host.url, ", ".join(host.models) or "nothing")
        else:
            log.warning("remote %s: %s (looked at again every %gs)", host.url, host.error, CHECK_S)
