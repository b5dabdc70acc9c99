"""Stored Responses, for `previous_response_id` and `GET/DELETE
/v1/responses/{id}`: per process, a time-to-live and a byte-capped LRU; in
a folder that a router's model processes share (so a model's process that
restarts or is unloaded keeps the turns it stored); or in Redis
(HEARTH_REDIS_URL), shared by every web node. Each belongs to the key that
made it (its holder, core/holders.py): asked for by another key, it is not
there."""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from core import fs, holders

log = logging.getLogger("hearth.responses")


@dataclass
class Stored:
    response: dict  # the response object as the client saw it
    messages: list[dict]  # the chat turn it answered: instructions, history and new input
    output: list[dict]  # the reply as chat messages (assistant text and tool calls)
    instructions: str | None
    system: list[str]  # system/developer input items of this and earlier turns
    nbytes: int
    expires: float
    holder: str = ""  # the key that made it; "" is everyone's


class ResponseStore:
    def __init__(self, ttl_s: float = 3600.0, max_bytes: int = 32 << 20, clock=time.monotonic):
        self.ttl_s, self.max_bytes, self.clock = ttl_s, max_bytes, clock
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response: dict, messages: list[dict], output: list[dict], instructions: str | None,
            system: list[str] | None = None, holder: str = "") -> None:
        size = len(json.dumps([response, messages, output, instructions, system], ensure_ascii=False).encode())
        if size > self.max_bytes:
            return
        with self._lock:
            self._drop(response["id"])
            self._items[response["id"]] = Stored(response, messages, output, instructions, system or [], size,
                                                 self.clock() + self.ttl_s, holder)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._items)))

    def get(self, response_id: str, holder: str = "") -> Stored | None:
        with self._lock:
            self._expire()
            item = self._items.get(response_id)
            if item is None or not holders.may_see(item.holder, holder):
                return None
            self._items.move_to_end(response_id)
            return item

    def delete(self, response_id: str, holder: str = "") -> bool:
        with self._lock:
            self._expire()
            item = self._items.get(response_id)
            return item is not None and holders.may_see(item.holder, holder) and self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        item = self._items.pop(response_id, None)
        if item is None:
            return False
        self._bytes -= item.nbytes
        return True

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, v in self._items.items() if v.expires <= now]:
            self._drop(key)

    def stats(self) -> dict:
        with self._lock:
            self._expire()
            return {"entries": len(self._items), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "ttl_ms": int(self.ttl_s * 1000)}


class RedisResponseStore:
    """The same store in Redis (HEARTH_REDIS_URL), so a turn stored by one
    web node continues on another: one key per response with the time to
    live as its expiry. The byte cap applies per turn; the total is Redis's
    own `maxmemory` to bound. The interface of ResponseStore."""

    PREFIX = "hearth:response:"

    def __init__(self, url: str, ttl_s: float = 3600.0, max_bytes: int = 32 << 20):
        import redis

        self.ttl_s, self.max_bytes = ttl_s, max_bytes
        self._client: Any = redis.Redis.from_url(url)

    def put(self, response: dict, messages: list[dict], output: list[dict], instructions: str | None,
            system: list[str] | None = None, holder: str = "") -> None:
        data = json.dumps([response, messages, output, instructions, system or [], holder],
                          ensure_ascii=False).encode()
        if len(data) > self.max_bytes:
            return
        self._client.set(self.PREFIX + response["id"], data, px=max(1, int(self.ttl_s * 1000)))

    def get(self, response_id: str, holder: str = "") -> Stored | None:
        data = self._client.get(self.PREFIX + response_id)
        if data is None:
            return None
        response, messages, output, instructions, system, *rest = json.loads(data)
        item = Stored(response, messages, output, instructions, system, len(data), 0.0, rest[0] if rest else "")
        return item if holders.may_see(item.holder, holder) else None

    def delete(self, response_id: str, holder: str = "") -> bool:
        if self.get(response_id, holder) is None:
            return False
        return bool(self._client.delete(self.PREFIX + response_id))

    def stats(self) -> dict:
        """Counted key by key (what one hour of turns holds): for /stats, not a hot path."""
        keys = list(self._client.scan_iter(match=self.PREFIX + "*", count=1000))
        with self._client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.strlen(key)
            sizes = pipe.execute()
        return {"entries": len(keys), "bytes": sum(sizes), "max_bytes": self.max_bytes,
                "ttl_ms": int(self.ttl_s * 1000), "backend": "redis"}


class FolderResponseStore:
    """The store as one JSON file per turn in a folder: the router's model
    processes share one (`hearth serve --response-store DIR`, set by the
    router), so a turn outlives the process that stored it and continues on
    any model; the router removes the folder when it stops. The time to live
    is wall-clock; the byte cap drops the least recently read turns (a read
    touches the file). Writes are atomic (a rename); the cap is kept under a
    lock on the folder, once a sixteenth of it has been written since the
    last look (a look lists the folder). The interface of ResponseStore."""

    SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")  # a file name; any other id is simply not stored

    def __init__(self, folder: str | os.PathLike[str], ttl_s: float = 3600.0, max_bytes: int = 32 << 20):
        self.folder, self.ttl_s, self.max_bytes = Path(folder), ttl_s, max_bytes
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # whole conversations: the owner's alone
        self._written = 0  # bytes this process stored since it last kept the folder within the cap

    def _path(self, response_id: str) -> Path | None:
        return self.folder / f"{response_id}.json" if self.SAFE_ID.fullmatch(response_id) else None

    def put(self, response: dict, messages: list[dict], output: list[dict], instructions: str | None,
            system: list[str] | None = None, holder: str = "") -> None:
        path = self._path(str(response.get("id", "")))
        data = json.dumps([response, messages, output, instructions, system or [], holder,
                           time.time() + self.ttl_s], ensure_ascii=False).encode()
        if path is None or len(data) > self.max_bytes:
            return
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # removed under us: made again
            fs.write_atomically(path, data, mode=0o600, durable=False)
            self._written += len(data)
            # Listing the folder is what costs (put runs on the event loop): done once a sixteenth of the
            # cap has been written here, so the folder stays within the cap and a sixteenth per process.
            if self._written >= self.max_bytes // 16:
                self._written = 0
                with self._locked():
                    self._keep_within()
        except OSError as exc:  # a full disk: the reply still goes out, this turn is not kept
            log.warning("stored Responses turns: %s was not kept: %s", path.name, exc)

    def get(self, response_id: str, holder: str = "") -> Stored | None:
        path = self._path(response_id)
        try:
            data = path.read_bytes() if path is not None else None
        except OSError:
            return None
        if data is None or path is None:
            return None
        try:
            response, messages, output, instructions, system, owner, expires = json.loads(data)
        except ValueError:
            return None
        if expires <= time.time():
            path.unlink(missing_ok=True)
            return None
        if not holders.may_see(owner, holder):
            return None
        try:
            os.utime(path)  # read now: the last the byte cap drops
        except OSError:
            pass
        return Stored(response, messages, output, instructions, system, len(data), expires, owner)

    def delete(self, response_id: str, holder: str = "") -> bool:
        path = self._path(response_id)
        if path is None or self.get(response_id, holder) is None:
            return False
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    @contextlib.contextmanager
    def _locked(self):
        with open(self.folder / ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield  # closing the file lets go of the lock

    def _files(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every live turn, least recently read first.
        A file neither written nor read for the time to live has expired
        (its expiry is its write time plus that): it goes now."""
        found, now = [], time.time()
        for path in self.folder.glob("*.json"):
            try:
                st = path.stat()
            except FileNotFoundError:  # dropped by another process meanwhile
                continue
            if st.st_mtime + self.ttl_s <= now:
                path.unlink(missing_ok=True)
            else:
                found.append((st.st_mtime, st.st_size, path))
        return sorted(found)

    def _keep_within(self) -> None:
        """Drop the least recently read turns until the folder is within the byte cap."""
        files = self._files()
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size

    def stats(self) -> dict:
        files = self._files()
        return {"entries": len(files), "bytes": sum(size for _, size, _ in files), "max_bytes": self.max_bytes,
                "ttl_ms": int(self.ttl_s * 1000), "backend": "folder"}


AnyResponseStore = Union[ResponseStore, FolderResponseStore, RedisResponseStore]
