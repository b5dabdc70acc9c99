"""Resumable streams on disk (HEARTH_HOME/streams): each stream's
`<sid>.sse` (its bytes) and `<sid>.json` (`log.Meta`, its record), the
one thread that writes them (`Writer`), the lock file that marks the
streams of a running process as its own (`Owner`), and what a new
process makes of the folder (`recover`): a stream still marked live whose
owner's lock is free belonged to a process that died, and is cut at its
last whole event and ended with its crash event (`end_orphan`).

The writer is the only thread that writes a stream's files, so they are
written in order (a record is never overwritten by an older one), and
never on the event loop: bytes at most `FLUSH_S` behind the stream, and a
new stream's record at once when asked (`Writer.now`).

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

from core import surfaces
from core.fs import write_atomically
from serving.streams.log import LIVE, Meta, Stream

log = logging.getLogger("hearth.streams")

FLUSH_S = 0.25  # the most a byte waits before it is written


class Owner:
    """This process's claim on its live streams: an flock the kernel lets go when the process dies."""

    def __init__(self, folder: Path):
        owners = folder / "owners"
        owners.mkdir(parents=True, exist_ok=True)
        self.name = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.path = owners / f"{self.name}.lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    @staticmethod
    def gone(folder: Path, name: str) -> bool:
        """Whether the process that held `name` is gone (its lock is free)."""
        path = folder / "owners" / f"{name}.lock"
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
            self.path.unlink()


class Writer(threading.Thread):
    """Copies new bytes to disk behind the streams, and writes their meta: the
    one thread that writes a stream's files, so they are written in order
    (a record never overwritten by an older one) and never on the event loop."""

    def __init__(self):
        super().__init__(name="hearth-streams", daemon=True)
        self.dirty: set[Stream] = set()
        self.waiting: list[concurrent.futures.Future] = []  # `now` calls, answered once their flush is done
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closing = False

    def mark(self, stream: Stream) -> None:
        with self.lock:
            self.dirty.add(stream)

    def now(self, stream: Stream) -> concurrent.futures.Future:
        """Write `stream` out without waiting for `FLUSH_S`; the future is
        done once it is (or once the write failed: logged, tried again with
        the stream's next flush). Once closing, it is written here and now."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            queued = not self.closing
            if queued:
                self.dirty.add(stream)
                self.waiting.append(done)
        if queued:
            self.wake.set()
        else:
            _flush_logged(stream)
            done.set_result(None)
        return done

    def run(self) -> None:
        while not self.closing:
            self.wake.wait(FLUSH_S)
            self.wake.clear()
            self.flush_all()

    def flush_all(self) -> None:
        with self.lock:
            streams, self.dirty = self.dirty, set()
            waiting, self.waiting = self.waiting, []
        for stream in streams:
            _flush_logged(stream)
        for done in waiting:
            if done.set_running_or_notify_cancel():  # False: its waiter was cancelled
                done.set_result(None)

    def close(self) -> None:
        with self.lock:
            self.closing = True
        self.wake.set()
        if self.is_alive():
            self.join(10)
        self.flush_all()


def _flush_logged(stream: Stream) -> None:
    try:
        flush(stream)
    except OSError as exc:
        log.warning("stream %s could not be written: %s", stream.meta.conversation_id, exc)


def flush(stream: Stream) -> None:
    """Write what `stream` has that its file lacks, then its meta (writer thread or shutdown)."""
    data_path, meta_path = stream.path(".sse"), stream.path(".json")
    assert data_path is not None and meta_path is not None
    if stream.deleted:
        return
    with stream.lock:
        if stream.rewrite:
            data, append = bytes(stream.mem), False
            stream.rewrite = False
        else:
            data, append = bytes(stream.mem[stream.flushed - stream.mem_start:]), True
        upto = stream.meta.end
        meta = json.dumps(stream.meta.__dict__)
    try:
        if append:
            with open(data_path, "ab") as f:
                f.write(data)
        else:
            write_atomically(data_path, data, durable=False)
    except OSError:
        with stream.lock:
            stream.rewrite = True  # the file may hold part of it: written whole next time
        raise
    with stream.lock:
        stream.flushed = max(stream.flushed, upto) if append else upto
    write_atomically(meta_path, meta, durable=False)
    if stream.deleted:  # forgotten while this was written: it stays forgotten
        delete_files(stream)
        return
    if stream.meta.state != LIVE:
        stream.release_memory()


def recover(folder: Path, cap: int, expired: Callable[[Stream, float], bool]) -> dict[str, Stream]:
    """The streams earlier processes left in `folder`, by conversation id (the
    latest of each): those whose process died ended now, those `expired`
    (and older ones of a conversation) removed, and what belongs to no
    record, or to no running process, cleared away. A live stream another
    running process owns is left to it."""
    kept: dict[str, Stream] = {}
    now = time.time()
    for meta_path in sorted(folder.glob("*.json")):
        try:
            meta = Meta(**json.loads(meta_path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            log.warning("stream record %s is unreadable (%s); removed", meta_path.name, exc)
            meta_path.unlink(missing_ok=True)
            meta_path.with_suffix(".sse").unlink(missing_ok=True)
            continue
        if meta.state == LIVE:
            if not Owner.gone(folder, meta.owner):
                continue  # another running server's stream
            end_orphan(folder, meta)
        stream = Stream(meta, folder, cap)
        current = kept.get(meta.conversation_id)
        if expired(stream, now) or (current is not None and current.meta.created > meta.created):
            forget(stream)
            continue
        if current is not None:
            forget(current)
        kept[meta.conversation_id] = stream
    for data in folder.glob("*.sse"):
        if not data.with_suffix(".json").exists():  # its record was never written, or was removed
            data.unlink(missing_ok=True)
    for lock in (folder / "owners").glob("*.lock"):
        if Owner.gone(folder, lock.stem):
            lock.unlink(missing_ok=True)
    return kept


def forget(stream: Stream) -> None:
    """Mark `stream` deleted (the writer leaves it alone) and remove its files."""
    stream.deleted = True
    delete_files(stream)


def delete_files(stream: Stream) -> None:
    for suffix in (".sse", ".json"):
        path = stream.path(suffix)
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def end_orphan(folder: Path, meta: Meta) -> None:
    """A stream whose process died mid-generation: cut it at its last whole
    event, add its crash event, and record it as ended now (so it stays
    replayable for the TTL after this start, however long the server was down)."""
    data_path = folder / f"{meta.sid}.sse"
    ended_at = time.time()
    try:
        data = data_path.read_bytes()
    except FileNotFoundError:
        data = b""
    whole = data.rfind(b"\n\n")
    data = data[:whole + 2] if whole >= 0 else b""
    surface = surfaces.BY_NAME.get(meta.kind)
    if surface is not None and surface.numbered:  # numbered after the last event kept
        meta.on_crash = surface.follows(meta.on_crash.encode(), surfaces.last_sequence_number(data)).decode()
    data += meta.on_crash.encode()
    write_atomically(data_path, data, durable=False)
    meta.state, meta.ended_at, meta.end = "interrupted", ended_at, meta.start + len(data)
    write_atomically(folder / f"{meta.sid}.json", json.dumps(meta.__dict__), durable=False)
