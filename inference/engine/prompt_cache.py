"""The prompt cache: KV caches of finished requests, reused by the next
request that starts with the same tokens.

A RAM LRU bounded in bytes holds entries keyed by their token sequence
and namespace (the adapter set that computed them; "" for the base model).
A lookup finds the entry sharing the longest prefix with the new prompt
(a session's latest entry first, when the request names a session) in a
radix index of the entries' tokens (`prefix_index`), copies
its cache and trims it to the shared prefix, so only the rest of the prompt
is prefilled. With an SSD tier every base-model entry is also written to disk
behind the engine's back and found again after a restart (adapter entries
stay in RAM: an adapter's identity does not outlive its mount).

Everything here runs on the engine thread, except `stats()` and
`close_session()`, which take the lock.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from inference.engine.prefix_index import PrefixIndex, common_prefix

if TYPE_CHECKING:
    from inference.engine.ssd_cache import SSDCache

log = logging.getLogger("hearth.cache")

MAX_SESSIONS = 4096


def tokens_key(tokens: np.ndarray, ns: str = "") -> str:
    digest = hashlib.sha1(tokens.astype(np.int32).tobytes())
    if ns:
        digest.update(b"\0" + ns.encode())
    return digest.hexdigest()


def compact(cache: list) -> list:
    """Drop the spare capacity KV buffers grow by, so bytes are honest."""
    from mlx.utils import tree_map

    for c in cache:
        keys = getattr(c, "keys", None)
        offset = getattr(c, "offset", None)
        if keys is None or not isinstance(offset, int):
            continue
        first = keys[0] if isinstance(keys, (tuple, list)) else keys
        if first.shape[-2] > offset:
            c.keys, c.values = tree_map(lambda x, n=offset: x[..., :n, :], (c.keys, c.values))
    return cache


@dataclass
class Entry:
    key: str
    tokens: np.ndarray
    cache: list
    nbytes: int
    durable: bool = False  # a complete copy is on the SSD tier
    ns: str = ""  # the adapter set that computed it


@dataclass
class Counters:
    hits: int = 0
    misses: int = 0
    session_hits: int = 0
    session_misses: int = 0
    prefix_scans: int = 0
    evictions: int = 0


class PromptCache:
    def __init__(self, max_bytes: int, ssd: SSDCache | None = None, trimmable: bool = True):
        self.max_bytes = max_bytes
        self.ssd = ssd  # an SSDCache, or None
        self.trimmable = trimmable
        self.entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self.index: dict[str, PrefixIndex[str]] = {}  # adapter set -> its entries' tokens
        self.bytes = 0
        self.sessions: OrderedDict[str, str] = OrderedDict()  # session id -> entry key, oldest first
        self._holders: dict[str, set[str]] = {}  # entry key -> the sessions pointing at it (`sessions` reversed)
        self.counters = Counters()
        self._lock = threading.Lock()

    # -- lookup ----------------------------------------------------------
    def lookup(self, prompt: list[int], session: str | None = None, ns: str = "") -> tuple[list | None, int]:
        """A private cache holding the longest reusable prefix of `prompt`
        computed under the same adapter set `ns`, and its length, or (None,
        0). At least one prompt token is always left to prefill: generation
        starts from the model's last logits."""
        tokens = np.asarray(prompt, dtype=np.int32)
        limit = len(tokens) - 1
        if limit <= 0 or self.max_bytes <= 0:
            return None, 0
        best, length = self._session_entry(session, tokens, limit, ns)
        if best is None:
            with self._lock:
                self.counters.prefix_scans += 1
            best, length = self._scan(tokens, limit, ns)
        if best is None or length == 0:
            with self._lock:
                self.counters.misses += 1
            return None, 0
        extra = len(best.tokens) - length
        # Checked per entry: a rotating (sliding-window) cache stops being trimmable once it wraps.
        if extra and not (self.trimmable and all(c.is_trimmable() for c in best.cache)):
            best, length = self._whole(tokens, limit, ns)  # the longest the prompt starts with
            extra = 0
            if best is None:
                with self._lock:
                    self.counters.misses += 1
                return None, 0
        cache = copy.deepcopy(best.cache)
        for c in cache if extra else ():
            c.trim(extra)
        with self._lock:
            self.entries.move_to_end(best.key)
            self.counters.hits += 1
        return cache, length

    def _session_entry(self, session: str | None, tokens: np.ndarray, limit: int, ns: str):
        if session is None:
            return None, 0
        entry = self.entries.get(self.sessions.get(session, ""))
        if entry is not None and entry.ns == ns:
            want = min(len(entry.tokens), limit)
            if common_prefix(entry.tokens, tokens) >= want:
                with self._lock:
                    self.counters.session_hits += 1
                return entry, want
        with self._lock:
            self.counters.session_misses += 1
        return None, 0

    def _scan(self, tokens: np.ndarray, limit: int, ns: str) -> tuple[Entry | None, int]:
        if not self.trimmable:  # only an entry the prompt starts with is usable as it is
            best, length = self._whole(tokens, limit, ns)
        else:
            index = self.index.get(ns)
            key, length = index.longest(tokens, limit) if index is not None else (None, 0)
            best = self.entries[key] if key is not None else None
        ssd = self.ssd
        if ssd is not None and not ns:
            key, n = ssd.find(tokens, limit, whole=not self.trimmable)
            if key is not None and n > length and key not in self.entries:
                restored = self._restore(ssd, key)
                if restored is not None:
                    best, length = restored, n
        return best, length

    def _whole(self, tokens: np.ndarray, limit: int, ns: str) -> tuple[Entry | None, int]:
        """The longest entry `tokens` starts with, of at most `limit` tokens: one usable without a trim."""
        index = self.index.get(ns)
        key, length = index.whole(tokens, limit) if index is not None else (None, 0)
        return (self.entries[key], length) if key is not None else (None, 0)

    def _restore(self, ssd: SSDCache, key: str) -> Entry | None:
        loaded = ssd.load(key)
        if loaded is None:
            return None
        tokens, cache = loaded
        entry = Entry(key, tokens, cache, sum(c.nbytes for c in cache), durable=True)
        ssd.note_written(entry)
        self._insert(entry)
        return entry if key in self.entries else None

    # -- publish ---------------------------------------------------------
    def publish(self, tokens: list[int], cache: list, session: str | None = None, ns: str = "") -> None:
        """Keep `cache`, which holds exactly `tokens` as adapter set `ns`
        computed them, for later requests."""
        import mlx.core as mx

        if self.max_bytes <= 0 or not tokens or not cache:
            return
        arr = np.asarray(tokens, dtype=np.int32)
        key = tokens_key(arr, ns)
        if key in self.entries:
            with self._lock:
                self.entries.move_to_end(key)
                if session:
                    self._bind(session, key)
            return
        cache = compact(cache)
        mx.eval([c.state for c in cache])
        entry = Entry(key, arr, cache, sum(c.nbytes for c in cache), ns=ns)
        # An entry whose tokens the new one extends is covered by it, where the new one can be trimmed back
        # (not a model's recurrent state, nor a sliding-window cache that has wrapped).
        index = self.index.get(ns)
        trimmable = self.trimmable and all(c.is_trimmable() for c in cache)
        covered = [] if entry.nbytes > self.max_bytes or index is None or not trimmable else [
            self.entries[k] for k in index.prefixes(arr)]
        for old in covered:
            self._drop(old)
        self._insert(entry)
        if key in self.entries:
            with self._lock:
                for old in covered:  # their sessions now point at the entry that covers them
                    for name in self._holders.pop(old.key, ()):
                        self._point(name, key)
                if session:
                    self._bind(session, key)
        if self.ssd is not None and key in self.entries and not ns:
            self.ssd.submit(entry)

    def _insert(self, entry: Entry) -> None:
        if entry.nbytes > self.max_bytes:
            log.info("prompt cache: entry of %d bytes exceeds --prompt-cache-bytes", entry.nbytes)
            return
        with self._lock:
            self.entries[entry.key] = entry
            self.bytes += entry.nbytes
        self.index.setdefault(entry.ns, PrefixIndex()).add(entry.key, entry.tokens)
        while self.bytes > self.max_bytes:
            self._drop(self._victim(), evicted=True)

    def _victim(self) -> Entry:
        """The least recently used entry no session points at, else the least
        recently used one."""
        for entry in self.entries.values():
            if entry.key not in self._holders:
                return entry
        return next(iter(self.entries.values()))

    def _drop(self, entry: Entry, evicted: bool = False) -> None:
        with self._lock:
            self.entries.pop(entry.key, None)
            self.bytes -= entry.nbytes
            if evicted:
                self.counters.evictions += 1
        index = self.index.get(entry.ns)
        if index is not None:
            index.remove(entry.key)
            if not len(index):
                del self.index[entry.ns]
        if evicted and self.ssd is not None:
            self.ssd.note_demotion(entry.durable, entry.key)

    # -- sessions and flush ------------------------------------------------
    def _bind(self, session: str, key: str) -> None:
        """Point `session` at `key` (lock held); the oldest sessions are
        forgotten beyond MAX_SESSIONS, like a close would."""
        self._point(session, key)
        self.sessions.move_to_end(session)
        while len(self.sessions) > MAX_SESSIONS:
            self._unpoint(next(iter(self.sessions)))

    def _point(self, session: str, key: str) -> None:
        """`session` -> `key` in both maps (lock held); a session already there keeps its place in the order."""
        old = self.sessions.get(session)
        if old is not None and old != key:
            self._let_go(old, session)
        self.sessions[session] = key
        self._holders.setdefault(key, set()).add(session)

    def _unpoint(self, session: str) -> None:
        key = self.sessions.pop(session, None)
        if key is not None:
            self._let_go(key, session)

    def _let_go(self, key: str, session: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(session)
            if not holders:
                del self._holders[key]

    def forget_adapter(self, part: str) -> int:
        """Drop the entries an adapter mount ("id@generation") computed:
        nothing can use them once it is unmounted or replaced."""
        dead = [e for e in self.entries.values() if e.ns and part in e.ns.split("+")]
        for entry in dead:
            self._drop(entry)
        return len(dead)

    def close_session(self, session: str) -> None:
        with self._lock:
            self._unpoint(session)

    def pending_durability(self) -> list[Entry]:
        """Base-model RAM entries without a complete copy on the SSD tier."""
        return [e for e in self.entries.values() if not e.durable and not e.ns]

    def stats(self) -> dict:
        with self._lock:
            c = self.counters
            return {"entries": len(self.entries), "bytes": self.bytes, "max_bytes": self.max_bytes,
                    "hits": c.hits, "misses": c.misses, "session_hits": c.session_hits,
                    "session_misses": c.session_misses, "prefix_scans": c.prefix_scans,
                    "evictions": c.evictions, "sessions": len(self.sessions)}
