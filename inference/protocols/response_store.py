"""Stored Responses, for `previous_response_id`, `item_reference` input
items and `GET/DELETE /v1/responses/{id}` (and its `input_items`): per process, a time-to-live and a byte-capped LRU; in
a folder that a router's model processes share (so a model's process that
restarts or is unloaded keeps the turns it stored); or in Redis
(HEARTH_REDIS_URL), shared by every web node. Each belongs to the key that
made it (its holder, core/holders.py): asked for by another key, it is not
there.

An item (an output item of a stored response, or one of its input items,
each with its id) is found through an index from its id to the response
that holds it, kept as that response is: gone with it (or, in Redis and
the folder, left pointing at nothing, which reads as not found). An input
item that carries the id of an item already indexed (an output item sent
back) leaves the index pointing where it did."""
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
from dataclasses import dataclass, field
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
    input: list[dict] = field(default_factory=list)  # its input items as Responses items, each with an id

    def item(self, item_id: str) -> dict | None:
        """Its output or input item of that id."""
        items = [*(self.response.get("output") or ()), *self.input]
        return next((i for i in items if isinstance(i, dict) and i.get("id") == item_id), None)


def _ids(response: dict, input_items: list[dict]) -> tuple[list[str], list[str]]:
    """The ids of a response's output items, and of its input items."""
    def ids(items) -> list[str]:
        return [i["id"] for i in items if isinstance(i, dict) and isinstance(i.get("id"), str) and i["id"]]
    return ids(response.get("output") or ()), ids(input_items)


class ResponseStore:
    def __init__(self, ttl_s: float = 3600.0, max_bytes: int = 32 << 20, clock=time.monotonic):
        self.ttl_s, self.max_bytes, self.clock = ttl_s, max_bytes, clock
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._where: dict[str, str] = {}  # item id -> the id of the response that holds it
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response: dict, messages: list[dict], output: list[dict], instructions: str | None,
            system: list[str] | None = None, holder: str = "", input_items: list[dict] | None = None) -> None:
        size = len(json.dumps([response, messages, output, instructions, system, input_items],
                              ensure_ascii=False).encode())
        if size > self.max_bytes:
            return
        with self._lock:
            self._drop(response["id"])
            self._items[response["id"]] = Stored(response, messages, output, instructions, system or [], size,
                                                 self.clock() + self.ttl_s, holder, input_items or [])
            self._bytes += size
            outputs, inputs = _ids(response, input_items or [])
            self._where.update(dict.fromkeys(outputs, response["id"]))
            for item_id in inputs:
                self._where.setdefault(item_id, response["id"])
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._items)))

    def item(self, item_id: str, holder: str = "") -> dict | None:
        with self._lock:
            response_id = self._where.get(item_id)
        stored = self.get(response_id, holder) if response_id is not None else None
        return stored.item(item_id) if stored is not None else None

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
        outputs, inputs = _ids(item.response, item.input)
        for item_id in outputs + inputs:
            if self._where.get(item_id) == response_id:
                del self._where[item_id]
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
    ITEM_PREFIX = "hearth:response-item:"  # an item's id -> the id of the response that holds it

    def __init__(self, url: str, ttl_s: float = 3600.0, max_bytes: int = 32 << 20):
        import redis

        self.ttl_s, self.max_bytes = ttl_s, max_bytes
        self._client: Any = redis.Redis.from_url(url)

    def put(self, response: dict, messages: list[dict], output: list[dict], instructions: str | None,
            system: list[str] | None = None, holder: str = "", input_items: list[dict] | None = None) -> None:
        data = json.dumps([response, messages, output, instructions, system or [], holder, input_items or []],
                          ensure_ascii=False).encode()
        if len(data) > self.max_bytes:
            return
        ttl_ms = max(1, int(self.ttl_s * 1000))
        outputs, inputs = _ids(response, input_items or [])
        with self._client.pipeline(transaction=False) as pipe:
            pipe.set(self.PREFIX + response["id"], data, px=ttl_ms)
            for item_id in outputs:
                pipe.set(self.ITEM_PREFIX + item_id, response["id"], px=ttl_ms)
            for item_id in inputs:
                pipe.set(self.ITEM_PREFIX + item_id, response["id"], px=ttl_ms, nx=True)
            pipe.execute()

    def get(self, response_id: str, holder: str = "") -> Stored | None:
        data = self._client.get(self.PREFIX + response_id)
        if data is None:
            return None
        response, messages, output, instructions, system, *rest = json.loads(data)  # older turns: fewer fields
        item = Stored(response, messages, output, instructions, system, len(data), 0.0, rest[0] if rest else "",
                      rest[1] if len(rest) > 1 else [])
        return item if holders.may_see(item.holder, holder) else None

    def item(self, item_id: str, holder: str = "") -> dict | None:
        response_id = self._client.get(self.ITEM_PREFIX + item_id)
        stored = self.get(response_id.decode(), holder) if response_id is not None else None
        return stored.item(item_id) if stored is not None else None

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
    last look (a look lists the folder). An item's index entry is a file
    `<item id>.item` holding its response's id, written with the turn and
    expiring with it (the look removes those older than the time to live).
    The interface of ResponseStore."""

    SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")  # a file name; any other id is simply not stored

    def __init__(self, folder: str | os.PathLike[str], ttl_s: float = 3600.0, max_bytes: int = 32 << 20):
        self.folder, self.ttl_s, self.max_bytes = Path(folder), ttl_s, max_bytes
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # whole conversations: the owner's alone
        self._written = 0  # bytes this process stored since it last kept the folder within the cap

    def _path(self, response_id: str, suffix: str = ".json") -> Path | None:
        return self.folder / f"{response_id}{suffix}" if self.SAFE_ID.fullmatch(response_id) else None

    def put(self, response: dict, messages: list[dict], output: list[dict], instructions: str | None,
            system: list[str] | None = None, holder: str = "", input_items: list[dict] | None = None) -> None:
        path = self._path(str(response.get("id", "")))
        data = json.dumps([response, messages, output, instructions, system or [], holder,
                           time.time() + self.ttl_s, input_items or []], ensure_ascii=False).encode()
        if path is None or len(data) > self.max_bytes:
            return
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # removed under us: made again
            fs.write_atomically(path, data, mode=0o600, durable=False)
            self._written += len(data)
            outputs, inputs = _ids(response, input_items or [])
            for item_id, replace in [*((i, True) for i in outputs), *((i, False) for i in inputs)]:
                ref = self._path(item_id, ".item")  # an id that is not a file name is not indexed
                if ref is not None and (replace or not ref.exists()):
                    fs.write_atomically(ref, response["id"].encode(), mode=0o600, durable=False)
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
            response, messages, output, instructions, system, owner, expires, *rest = json.loads(data)
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
        return Stored(response, messages, output, instructions, system, len(data), expires, owner,
                      rest[0] if rest else [])  # a turn an older version wrote has no input items

    def item(self, item_id: str, holder: str = "") -> dict | None:
        ref = self._path(item_id, ".item")
        try:
            response_id = ref.read_text() if ref is not None else None
        except (OSError, UnicodeDecodeError):
            return None
        stored = self.get(response_id, holder) if response_id else None
        return stored.item(item_id) if stored is not None else None

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
        """Drop the least recently read turns until the folder is within the byte cap, and the index
        entries written longer ago than the time to live (their turns have expired)."""
        now = time.time()
        for ref in self.folder.glob("*.item"):
            with contextlib.suppress(FileNotFoundError):
                if ref.stat().st_mtime + self.ttl_s <= now:
                    ref.unlink(missing_ok=True)
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
