"""Stored Responses, for `previous_response_id`, `item_reference` input
items and `GET/DELETE /v1/responses/{id}` (and its `input_items`): per process, a time-to-live and a byte-capped LRU; in
a folder that a router's model processes share (so a model's process that
restarts or is unloaded keeps the turns it stored); or in Redis
(HEARTH_REDIS_URL), shared by every web node. Each belongs to the key that
made it (its holder, core/holders.py): asked for by another key, it is not
there.

An item (an output item of a stored response, or one of its input items,
each with its id) is found through an index from (holder, item id) to the
newest response of that holder that holds it: agents send the same items
back every turn, so the item stays found while any turn that holds it is
stored, and one key's turns never move another key's entries. The index
is kept as the responses are: an entry goes with its response (or, in
Redis, is left pointing at nothing, which reads as not found). A turn has
at most `max_messages` input items (the request is refused past that), so
one turn adds a bounded number of entries.

The folder's index is one SQLite file (`index.sqlite`) beside the turns,
which every process of a router opens (SQLite's own locking): a lookup is
one indexed query, a turn's entries are one transaction, and entries are
removed with their turns; its live pages count toward the byte cap. A
file per item (the rename-per-entry alternative) cost one atomic write
per input item on the event loop, outside the cap, swept only by age."""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
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

    @cached_property
    def _by_id(self) -> dict[str, dict]:
        by_id: dict[str, dict] = {}
        for i in [*(self.response.get("output") or ()), *self.input]:
            if isinstance(i, dict) and isinstance(i.get("id"), str):
                by_id.setdefault(i["id"], i)  # an output item first, as the id was first given to it
        return by_id

    def item(self, item_id: str) -> dict | None:
        """Its output or input item of that id."""
        return self._by_id.get(item_id)


def _ids(response: dict, input_items: list[dict]) -> list[str]:
    """The ids of a response's output and input items, each once."""
    items = [*(response.get("output") or ()), *input_items]
    return list(dict.fromkeys(i["id"] for i in items if isinstance(i, dict) and isinstance(i.get("id"), str)
                              and i["id"]))


def _holders(holder: str) -> list[str]:
    """The index entries a request held by `holder` may read, its own first
    (what "" stored is everyone's, as holders.may_see has it)."""
    return [holder, ""] if holder else [""]


class ResponseStore:
    def __init__(self, ttl_s: float = 3600.0, max_bytes: int = 32 << 20, clock=time.monotonic):
        self.ttl_s, self.max_bytes, self.clock = ttl_s, max_bytes, clock
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._where: dict[tuple[str, str], str] = {}  # (holder, item id) -> its newest response's id
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
            self._where.update(dict.fromkeys(((holder, i) for i in _ids(response, input_items or [])),
                                             response["id"]))
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._items)))

    def where(self, item_ids: list[str], holder: str = "") -> dict[str, str]:
        """The id of the newest response this holder may see that holds each item, for those indexed."""
        with self._lock:
            found = ((i, next((r for h in _holders(holder) if (r := self._where.get((h, i)))), None))
                     for i in item_ids)
            return {i: r for i, r in found if r is not None}

    def item(self, item_id: str, holder: str = "") -> dict | None:
        return _item(self, item_id, holder)

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
        for key in ((item.holder, i) for i in _ids(item.response, item.input)):
            if self._where.get(key) == response_id:
                del self._where[key]
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
    ITEM_PREFIX = "hearth:response-item:"  # <holder>:<item id> -> the id of its newest response

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
        with self._client.pipeline(transaction=False) as pipe:
            pipe.set(self.PREFIX + response["id"], data, px=ttl_ms)
            for item_id in _ids(response, input_items or []):
                pipe.set(f"{self.ITEM_PREFIX}{holder}:{item_id}", response["id"], px=ttl_ms)
            pipe.execute()

    def get(self, response_id: str, holder: str = "") -> Stored | None:
        data = self._client.get(self.PREFIX + response_id)
        if data is None:
            return None
        response, messages, output, instructions, system, *rest = json.loads(data)  # older turns: fewer fields
        item = Stored(response, messages, output, instructions, system, len(data), 0.0, rest[0] if rest else "",
                      rest[1] if len(rest) > 1 else [])
        return item if holders.may_see(item.holder, holder) else None

    def where(self, item_ids: list[str], holder: str = "") -> dict[str, str]:
        if not item_ids:
            return {}
        keys = [f"{self.ITEM_PREFIX}{h}:{i}" for i in item_ids for h in _holders(holder)]
        values = iter(self._client.mget(keys))  # one round trip for every reference of a request
        found = {}
        for item_id in item_ids:
            ours = [next(values) for _ in _holders(holder)]
            response_id = next((r for r in ours if r is not None), None)
            if response_id is not None:
                found[item_id] = response_id.decode()
        return found

    def item(self, item_id: str, holder: str = "") -> dict | None:
        return _item(self, item_id, holder)

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
    last look (a look lists the folder). The item index is `index.sqlite`
    (the module's docstring): a turn's entries are written with it, in one
    transaction, and removed when it is dropped, deleted or expires.
    The interface of ResponseStore."""

    SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")  # a file name; any other id is simply not stored
    INDEX = "index.sqlite"

    def __init__(self, folder: str | os.PathLike[str], ttl_s: float = 3600.0, max_bytes: int = 32 << 20):
        self.folder, self.ttl_s, self.max_bytes = Path(folder), ttl_s, max_bytes
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # whole conversations: the owner's alone
        self._written = 0  # bytes this process stored since it last kept the folder within the cap

    def _path(self, response_id: str, suffix: str = ".json") -> Path | None:
        return self.folder / f"{response_id}{suffix}" if self.SAFE_ID.fullmatch(response_id) else None

    @contextlib.contextmanager
    def _index(self, write: bool = True):
        """The index, in a transaction (committed on leaving): a connection per use, as a lookup runs on a
        worker thread and a write on the event loop, and each process of the router opens its own. The
        rollback journal, not a WAL: a WAL file stays as large as its largest checkpoint, outside the cap."""
        db = sqlite3.connect(self.folder / self.INDEX, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous=OFF")  # the folder lives as long as the router, not past a crash
            db.execute("CREATE TABLE IF NOT EXISTS item (holder TEXT NOT NULL, id TEXT NOT NULL, "
                       "response TEXT NOT NULL, expires REAL NOT NULL, PRIMARY KEY (holder, id)) WITHOUT ROWID")
            db.execute("CREATE INDEX IF NOT EXISTS item_response ON item (response)")
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    def put(self, response: dict, messages: list[dict], output: list[dict], instructions: str | None,
            system: list[str] | None = None, holder: str = "", input_items: list[dict] | None = None) -> None:
        path = self._path(str(response.get("id", "")))
        expires = time.time() + self.ttl_s
        data = json.dumps([response, messages, output, instructions, system or [], holder,
                           expires, input_items or []], ensure_ascii=False).encode()
        if path is None or len(data) > self.max_bytes:
            return
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # removed under us: made again
            fs.write_atomically(path, data, mode=0o600, durable=False)
            self._written += len(data)
            entries = [(holder, i, response["id"], expires) for i in _ids(response, input_items or [])]
            if entries:
                with self._index() as db:  # this turn now the newest to hold each of its items
                    db.executemany("INSERT OR REPLACE INTO item VALUES (?, ?, ?, ?)", entries)
            # Listing the folder is what costs (put holds the store's lock meanwhile): done once a sixteenth of the
            # cap has been written here, so the folder stays within the cap and a sixteenth per process.
            if self._written >= self.max_bytes // 16:
                self._written = 0
                with self._locked():
                    self._keep_within()
        except (OSError, sqlite3.Error) as exc:  # a full disk: the reply still goes out, this turn is not kept
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

    def where(self, item_ids: list[str], holder: str = "") -> dict[str, str]:
        if not item_ids:
            return {}
        try:
            with self._index(write=False) as db:
                found = {}
                for h in reversed(_holders(holder)):  # the holder's own entry wins over everyone's
                    for start in range(0, len(item_ids), 500):  # SQLite's bound on parameters
                        ids = item_ids[start:start + 500]
                        rows = db.execute(f"SELECT id, response FROM item WHERE holder = ? AND expires > ? "
                                          f"AND id IN ({','.join('?' * len(ids))})", [h, time.time(), *ids])
                        found.update(dict(rows.fetchall()))
                return found
        except sqlite3.Error as exc:
            log.warning("stored Responses items: the index could not be read: %s", exc)
            return {}

    def item(self, item_id: str, holder: str = "") -> dict | None:
        return _item(self, item_id, holder)

    def delete(self, response_id: str, holder: str = "") -> bool:
        path = self._path(response_id)
        if path is None or self.get(response_id, holder) is None:
            return False
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        self._unindex([response_id])
        return True

    def _unindex(self, response_ids: list[str]) -> None:
        """The index entries of turns that are gone, and of those expired."""
        if not (self.folder / self.INDEX).exists():
            return
        try:
            with self._index() as db:
                db.executemany("DELETE FROM item WHERE response = ?", [(r,) for r in response_ids])
                db.execute("DELETE FROM item WHERE expires <= ?", (time.time(),))
        except sqlite3.Error as exc:
            log.warning("stored Responses items: the index could not be updated: %s", exc)

    EMPTY_PAGES = 3  # an index with no entries: SQLite's schema page, the table's root and its index's

    def _index_bytes(self) -> int:
        """The index's pages that hold entries (its free pages are reused, not grown)."""
        if not (self.folder / self.INDEX).exists():
            return 0
        try:
            with self._index(write=False) as db:
                size, pages, free = (db.execute(f"PRAGMA {p}").fetchone()[0]
                                     for p in ("page_size", "page_count", "freelist_count"))
                return size * max(0, pages - free - self.EMPTY_PAGES)
        except sqlite3.Error:
            return 0

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
        """Drop the least recently read turns until the folder (the index included) is within the byte
        cap, with their index entries and those of turns expired."""
        files = self._files()
        total = sum(size for _, size, _ in files) + self._index_bytes()
        dropped = []
        for _, size, path in files:
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            dropped.append(path.stem)
            total -= size  # the index shrinks too, by its entries for this turn (not counted: an upper bound)
        self._unindex(dropped)

    def stats(self) -> dict:
        files = self._files()
        return {"entries": len(files), "bytes": sum(size for _, size, _ in files) + self._index_bytes(),
                "max_bytes": self.max_bytes, "ttl_ms": int(self.ttl_s * 1000), "backend": "folder"}


def _item(store: AnyResponseStore, item_id: str, holder: str) -> dict | None:
    """The stored item of that id this holder may see, or None."""
    response_id = store.where([item_id], holder).get(item_id)
    stored = store.get(response_id, holder) if response_id is not None else None
    return stored.item(item_id) if stored is not None else None


AnyResponseStore = Union[ResponseStore, FolderResponseStore, RedisResponseStore]
