"""The SSD tier of the prompt cache.

Each entry is one safetensors file holding a sequence's KV cache and, in
its header, the tokens it covers. Files are written by one background
thread (write-behind, bounded in bytes) as temp file, fsync, rename, so a
crash leaves either the old state or the whole new file, never half of one.
At start the directory is scanned and every complete file is found again;
a file that is not whole (its header promises more bytes than it has) is
never indexed. A temp file names its writer's pid, so one a killed process
left is removed at the next start, while another live writer's is kept.

HEARTH_SSD_WRITE_DELAY (seconds; tests) pauses each write half way through
its temp file, so a crash can be aimed at a write in progress.

The engine thread turns MLX arrays into numpy copies before queueing them,
so the writer thread never touches MLX.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from core.procs import pid_alive
from inference.engine.prefix_index import PrefixIndex
from inference.engine.prompt_cache import Entry

log = logging.getLogger("hearth.cache")

SUFFIX = ".safetensors"
STALE_TMP_S = 600


def _writer_alive(tmp: Path) -> bool:
    """Whether the process named in `<key>.safetensors.<pid>.tmp` still runs
    (a temp name without a pid is an older writer's: judged by age alone)."""
    parts = tmp.name.split(".")
    if len(parts) < 3 or not parts[-2].isdigit():
        return True
    pid = int(parts[-2])
    return pid == os.getpid() or pid_alive(pid)


@dataclass
class _Snapshot:
    key: str
    entry: Entry  # marked durable once written
    arrays: dict
    metadata: dict
    nbytes: int


def _to_numpy(cache: list) -> tuple[dict, dict]:
    """The cache's state as numpy arrays plus the metadata to rebuild it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    arrays, scalars, dtypes = {}, {}, {}
    # Without a destination, tree_flatten answers a list of (path, leaf).
    for path, value in cast("list[tuple[str, Any]]", tree_flatten([c.state for c in cache])):
        if isinstance(value, mx.array):
            if value.dtype == mx.bfloat16:  # numpy has no bfloat16: keep the bits
                dtypes[path] = "bfloat16"
                value = value.view(mx.uint16)
            arrays[path] = np.array(value)
        else:
            scalars[path] = value
    meta = {"classes": json.dumps([type(c).__name__ for c in cache]),
            "scalars": json.dumps(scalars), "dtypes": json.dumps(dtypes)}
    return arrays, meta


def _from_numpy(arrays: dict, meta: dict) -> list:
    import mlx.core as mx
    from mlx.utils import tree_unflatten
    from mlx_lm.models import cache as cache_module

    dtypes = json.loads(meta["dtypes"])
    items = []
    for path, value in arrays.items():
        a = mx.array(value)
        if dtypes.get(path) == "bfloat16":
            a = a.view(mx.bfloat16)
        items.append((path, a))
    items += list(json.loads(meta["scalars"]).items())
    states = tree_unflatten(sorted(items, key=lambda kv: [int(p) for p in kv[0].split(".")]))
    classes = json.loads(meta["classes"])
    return [getattr(cache_module, name).from_state(state) for name, state in zip(classes, states, strict=True)]


SOURCE = "hearth-snapshot.json"  # in a namespace's folder: the model snapshot its entries were computed from
NAMESPACE = re.compile(r"[0-9a-f]{16}")  # the engine's namespaces: a hash of the snapshot, dtype and KV format


def prune_orphans(root: Path, keep: str) -> None:
    """Remove the namespaces under `root` whose model snapshot is gone (a
    checkpoint replaced, a revision garbage-collected): their entries can
    never be used again (a namespace is its snapshot's path, dtype and KV
    format). Only the engine's own folders are looked at (a namespace's name,
    with the record in it); anything else in `root` is left alone."""
    import shutil

    for folder in Path(root).iterdir():
        if folder.name == keep or not NAMESPACE.fullmatch(folder.name) or not folder.is_dir():
            continue
        try:
            source = json.loads((folder / SOURCE).read_text())["path"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not os.path.exists(source):
            log.info("ssd cache: removing %s, the entries of %s (gone)", folder, source)
            shutil.rmtree(folder, ignore_errors=True)


class SSDCache:
    def __init__(self, root: Path, namespace: str, max_bytes: int, queue_bytes: int, source: str | None = None):
        """`source`, the model snapshot's path, is recorded in the namespace's folder, and the folders
        of snapshots that are gone are removed (`prune_orphans`)."""
        self.dir = Path(root) / namespace
        self.dir.mkdir(parents=True, exist_ok=True)
        if source is not None:
            (self.dir / SOURCE).write_text(json.dumps({"path": source}))
            prune_orphans(Path(root), namespace)
        self.max_bytes = max_bytes
        self.queue_bytes = queue_bytes
        self.index: PrefixIndex[str] = PrefixIndex()  # the files' tokens by key
        self.sizes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: queue.Queue[_Snapshot | None] = queue.Queue()
        self._pending: dict[str, int] = {}  # key -> bytes, queued or being written
        self._dropped: set[str] = set()
        # key -> the RAM entry it was written from
        self._written: weakref.WeakValueDictionary[str, Entry] = weakref.WeakValueDictionary()
        self.restores = self.spills = self.demotions = self.dropped_spills = 0
        self.failed_spills = self.missing = 0
        self.restore_ms_last = 0.0
        self.write_delay = float(os.environ.get("HEARTH_SSD_WRITE_DELAY") or 0)
        self._scan()
        self._thread = threading.Thread(target=self._write_loop, name="hearth-ssd-cache", daemon=True)
        self._thread.start()

    # -- index -----------------------------------------------------------
    def _scan(self) -> None:
        from safetensors import safe_open

        for tmp in self.dir.glob("*.tmp"):
            try:  # a write a crash interrupted (the rename never happened); a fresh one may be another writer's
                if not _writer_alive(tmp) or time.time() - tmp.stat().st_mtime > STALE_TMP_S:
                    tmp.unlink(missing_ok=True)
            except OSError:
                continue
        for path in sorted(self.dir.glob("*" + SUFFIX)):
            try:
                with safe_open(str(path), framework="numpy") as f:
                    tokens = np.asarray(json.loads(f.metadata()["tokens"]), dtype=np.int32)
            except Exception as exc:  # unreadable: leave it on disk, do not use it
                log.warning("ssd cache: skipping %s (%s)", path.name, exc)
                continue
            key = path.name[: -len(SUFFIX)]
            self.index.add(key, tokens)
            self.sizes[key] = path.stat().st_size
        if self.index:
            log.info("ssd cache: %d entries (%d bytes) in %s", len(self.index), sum(self.sizes.values()), self.dir)

    def find(self, tokens: np.ndarray, limit: int, whole: bool = False) -> tuple[str | None, int]:
        """The file sharing the most tokens with `tokens` (at most `limit`), or with `whole` the longest one
        `tokens` starts with (for a cache that cannot be cut back), and the tokens it serves."""
        with self._lock:
            return self.index.whole(tokens, limit) if whole else self.index.longest(tokens, limit)

    def load(self, key: str):
        """(tokens, cache) from disk, or None when the file went bad. Engine thread."""
        from safetensors import safe_open

        started = time.perf_counter()
        path = self.dir / (key + SUFFIX)
        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata()
                arrays = {name: f.get_tensor(name) for name in f.keys()}
            cache = _from_numpy(arrays, meta)
            tokens = np.asarray(json.loads(meta["tokens"]), dtype=np.int32)
        except Exception as exc:
            log.warning("ssd cache: cannot restore %s (%s)", path.name, exc)
            with self._lock:
                self.index.remove(key)
                self.sizes.pop(key, None)
            return None
        try:
            os.utime(path)  # recently used: the size cap removes the oldest first
        except OSError:
            pass  # the size cap removed it meanwhile; the arrays are already in memory
        with self._lock:
            self.restores += 1
            self.restore_ms_last = round((time.perf_counter() - started) * 1000, 1)
        return tokens, cache

    # -- writing ---------------------------------------------------------
    def submit(self, entry: Entry, force: bool = False) -> bool:
        """Queue `entry` for writing; False when the queue is full (a dropped
        spill: the entry stays in RAM and a flush writes it). Engine thread."""
        with self._lock:
            if entry.key in self.index:
                entry.durable = True  # already on disk: no second write
                self._written[entry.key] = entry
                return True
            if entry.key in self._pending:
                return True
            if not force and sum(self._pending.values()) + entry.nbytes > self.queue_bytes:
                self.dropped_spills += 1
                self._dropped.add(entry.key)
                return False
        arrays, meta = _to_numpy(entry.cache)
        meta["tokens"] = json.dumps(entry.tokens.tolist())
        nbytes = sum(a.nbytes for a in arrays.values())
        with self._lock:
            self._pending[entry.key] = nbytes
            self._dropped.discard(entry.key)
        self._queue.put(_Snapshot(entry.key, entry, arrays, meta, nbytes))
        return True

    def note_written(self, entry: Entry) -> None:
        """`entry` (restored from disk) is backed by its file."""
        with self._lock:
            self._written[entry.key] = entry

    def note_demotion(self, durable: bool, key: str | None = None) -> None:
        """A RAM entry was evicted; it lives on if it reached the disk."""
        with self._lock:
            if durable:
                self.demotions += 1
            elif key is not None and key in self._dropped:
                self._dropped.discard(key)
                self.missing += 1

    def _write_loop(self) -> None:
        from safetensors.numpy import save

        while (snap := self._queue.get()) is not None:
            try:
                self._write(snap, save)
            except Exception:  # never let the writer die: pending counts would never clear
                log.exception("ssd cache: writer failed on %s", snap.key)
                with self._lock:
                    self.failed_spills += 1
                    self._pending.pop(snap.key, None)
                    self._idle.notify_all()

    def _write(self, snap: _Snapshot, save) -> None:
        path = self.dir / (snap.key + SUFFIX)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            data = save(snap.arrays, metadata=snap.metadata)
            with open(tmp, "wb") as f:
                if self.write_delay:
                    half = len(data) // 2
                    f.write(data[:half])
                    f.flush()
                    time.sleep(self.write_delay)
                    f.write(data[half:])
                else:
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            dir_fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the rename itself survives a power cut
            finally:
                os.close(dir_fd)
        except Exception as exc:
            log.error("ssd cache: writing %s failed: %s", path.name, exc)
            tmp.unlink(missing_ok=True)
            with self._lock:
                self.failed_spills += 1
                self._pending.pop(snap.key, None)
                self._idle.notify_all()
            return
        with self._lock:
            self.index.add(snap.key, np.asarray(json.loads(snap.metadata["tokens"]), dtype=np.int32))
            self.sizes[snap.key] = len(data)
            self.spills += 1
            snap.entry.durable = True
            self._written[snap.key] = snap.entry
        self._enforce_cap()
        with self._lock:  # only now is the write settled, cap included
            self._pending.pop(snap.key, None)
            self._idle.notify_all()

    def _enforce_cap(self) -> None:
        with self._lock:
            total = sum(self.sizes.values())
            if total <= self.max_bytes:
                return
            by_age = sorted(self.sizes, key=self._mtime)
        for key in by_age:
            if total <= self.max_bytes:
                break
            (self.dir / (key + SUFFIX)).unlink(missing_ok=True)
            with self._lock:
                total -= self.sizes.pop(key, 0)
                self.index.remove(key)
                entry = self._written.pop(key, None)
                if entry is not None:
                    entry.durable = False  # still in RAM, no longer on disk

    def _mtime(self, key: str) -> float:
        try:
            return (self.dir / (key + SUFFIX)).stat().st_mtime
        except OSError:
            return 0.0  # gone already: first in line

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def stats(self) -> dict:
        with self._lock:
            return {
                "dir": str(self.dir), "entries": len(self.index), "bytes": sum(self.sizes.values()),
                "max_bytes": self.max_bytes, "restores": self.restores, "spills": self.spills,
                "restore_ms_last": self.restore_ms_last, "demotions": self.demotions,
                "pending_snapshots": len(self._pending), "pending_spills": len(self._pending),
                "pending_spill_bytes": sum(self._pending.values()), "dropped_spills": self.dropped_spills,
                "failed_spills": self.failed_spills, "missing_snapshots": self.missing,
                "longest_durable_prefix_tokens": max(map(self.index.length, self.index.nodes), default=0),
            }
