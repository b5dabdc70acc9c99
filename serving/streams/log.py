"""One resumable stream: the bytes a generation sent, addressed by offset.

A `Stream` is appended to on the event loop by the task that runs its
generation, and read by any number of followers from any offset. Offsets
count every byte since the stream began, so a client that received K bytes
asks for the rest `from=K` and gets exactly them.

While the stream is live every retained byte is in memory (followers never
touch the disk); the writer thread (`disk.Writer`) copies new bytes to
`<sid>.sse` behind it. Once ended and on disk the memory is let go, unless
someone still follows, and reads come from the file.

A stream keeps at most `cap` bytes: past it, the oldest are dropped at an
event boundary (half the cap at a time), so a client that reconnects late
in a long generation still gets the tail. `start` is the first byte still
kept; a read from before it is refused (`Gone`). The store may also drop a
live stream's oldest events to keep all its streams within their total
(`trim`); those never go before every connected reader has read them.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from core import surfaces

LIVE = "live"
ENDED = ("done", "stopped", "failed", "interrupted")  # how a stream may end
READ_CHUNK = 64 << 10


class Gone(Exception):
    """The bytes asked for were dropped (the stream's cap)."""


@dataclass
class Meta:
    """What `<sid>.json` holds: enough to replay the stream after a restart."""

    sid: str
    conversation_id: str
    kind: str  # openai | anthropic | responses | chat: the shape of its events
    model: str | None
    created: float
    owner: str  # the serving process's lock file name (`disk.Owner`)
    on_crash: str  # the event that ends it if its process dies first
    state: str = LIVE
    holder: str = ""  # the key that made it (core/holders.py); "" is everyone's
    request: str = ""  # `store.request_key` of the POST that started it: an identical retry replays it
    trimmed: bool = False  # the streams' total cap dropped its oldest events (not only its own cap)
    ended_at: float | None = None
    start: int = 0
    end: int = 0

    def public(self) -> dict:
        return {"conversation_id": self.conversation_id, "status": self.state, "bytes": self.end,
                "start": self.start, "model": self.model, "kind": self.kind, "created": int(self.created),
                "ended_at": int(self.ended_at) if self.ended_at else None}


class Stream:
    def __init__(self, meta: Meta, folder: Path | None, cap: int):
        self.meta = meta
        self.folder = folder
        self.cap = cap
        self.lock = threading.Lock()  # mem, mem_start, flushed, rewrite: shared with the writer thread
        self.mem = bytearray()  # bytes [mem_start, meta.end)
        self.mem_start = meta.end
        self.flushed = meta.end  # bytes [meta.start, flushed) are in the file
        self.rewrite = False  # the file's head must go (the cap dropped bytes)
        self.followers = 0
        self._readers: dict[object, int] = {}  # each follower's next offset (event loop only)
        self.mirrored = meta.end  # bytes [.., mirrored) are in Redis too (shared.Shared), when it is set
        self.stopping = False
        self.deleted = False  # forgotten: the writer leaves it alone
        self.task: asyncio.Task | None = None  # the generation's pump (this process's live streams)
        self.stop_fn: Callable[[], Awaitable[None]] | None = None  # asks the generation to stop
        self.context: object = None  # what its owner keeps with it (a chat turn)
        self.error_event: Callable[[str], bytes] | None = None  # an event of its protocol that ends it failed
        # Asked once its producer ends: whether that end was a failure the producer wrote into the
        # stream itself (a model's process that died mid-reply), so it ends `failed`, not `done`.
        self.failed_fn: Callable[[], bool] | None = None
        self.done = asyncio.Event()
        if meta.state != LIVE:
            self.done.set()
        self._changed = asyncio.Event()

    # -- identity ------------------------------------------------------------
    @property
    def sid(self) -> str:
        return self.meta.sid

    @property
    def live(self) -> bool:
        return self.meta.state == LIVE

    @property
    def start(self) -> int:
        return self.meta.start

    @property
    def end(self) -> int:
        return self.meta.end

    def path(self, suffix: str) -> Path | None:
        return self.folder / f"{self.sid}{suffix}" if self.folder is not None else None

    # -- writing (event loop) -------------------------------------------------
    def append(self, data: bytes) -> None:
        if not data or not self.live:
            return
        with self.lock:
            self.mem += data
            self.meta.end += len(data)
            if self.meta.end - self.meta.start > self.cap:
                self._drop_head()
        self._wake()

    def _drop_head(self) -> None:
        """Keep about half the cap, from an event boundary on (lock held)."""
        cut = self.meta.end - self.cap // 2 - self.mem_start
        boundary = self.mem.find(b"\n\n", max(cut, 0))
        if boundary < 0:
            return  # one event larger than the cap: kept whole until it ends
        drop = boundary + 2
        del self.mem[:drop]
        self.mem_start += drop
        self.meta.start = self.mem_start
        self.rewrite = True

    def trim(self, excess: int) -> None:
        """Drop at least `excess` of the oldest bytes, and at least half of
        what is kept (so a full store does not trim at every event), up to
        an event boundary, but nothing a connected reader has still to read:
        a live client keeps its stream. Marks the stream `trimmed`."""
        with self.lock:
            kept = self.meta.end - self.meta.start
            upto = min(self.meta.end - min(kept - excess, kept // 2), *self._readers.values(), self.meta.end)
            boundary = self.mem.rfind(b"\n\n", 0, max(upto - self.mem_start, 0))
            if boundary < 0:
                return
            drop = boundary + 2
            del self.mem[:drop]
            self.mem_start += drop
            self.meta.start = self.mem_start
            self.meta.trimmed = self.rewrite = True

    def finish(self, state: str, tail: bytes = b"") -> None:
        """End the stream: `tail` is its last event (an error), `state` how it
        ended. In a protocol that numbers its events, `tail` gets the number
        after the last one sent; one that ends a stream `interrupted` is kept
        as its `on_crash` (`after_crash` answers it)."""
        if not self.live:
            return
        surface = surfaces.BY_NAME.get(self.meta.kind)
        if tail and surface is not None and surface.numbered:
            with self.lock:
                last = surfaces.last_sequence_number(self.mem)  # every byte since `start` is in memory while live
            tail = surface.follows(tail, last)
        if tail and state == "interrupted":
            self.meta.on_crash = tail.decode()
        if tail and self.mem and not self.mem.endswith(b"\n\n"):
            tail = b"\n\n" + tail  # after a relayed chunk cut mid-event, the error still starts an event
        self.append(tail)
        self.meta.state = state
        self.meta.ended_at = time.time()
        self.done.set()
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def release_memory(self) -> None:
        """Let go of the bytes once the file holds them all and nobody follows."""
        with self.lock:
            if not self.live and self.followers == 0 and self.folder is not None \
                    and self.flushed == self.meta.end and not self.rewrite:
                self.mem = bytearray()
                self.mem_start = self.meta.end

    # -- reading --------------------------------------------------------------
    def check_offset(self, offset: int) -> None:
        """Raise `Gone` for bytes dropped, ValueError for bytes that never were."""
        if offset < self.meta.start:
            why = (f"each stream keeps its last {self.cap} bytes, and while all streams together hold "
                   "--streams-max-bytes the oldest events of a running one go" if self.meta.trimmed
                   else f"each stream keeps its last {self.cap} bytes")
            raise Gone(f"bytes before {self.meta.start} of this stream are no longer kept ({why}); "
                       f"replay from={self.meta.start} or later")
        if offset > self.meta.end:
            raise ValueError(f"from={offset} is past the end of this stream ({self.meta.end} bytes so far)")

    async def read(self, offset: int, most: int = READ_CHUNK) -> bytes:
        with self.lock:
            if offset >= self.mem_start:
                at = offset - self.mem_start
                return bytes(self.mem[at:at + most])
        path = self.path(".sse")
        if path is None:
            return b""
        try:
            return await asyncio.to_thread(_pread, path, offset - self.meta.start, most)
        except FileNotFoundError:  # forgotten (its TTL, the total cap) before this reader began: it ends here
            return b""

    def after_crash(self, offset: int) -> bytes | None:
        """For a stream its process ended by dying: a client may hold bytes the
        disk never got (it writes behind), as many as it was sent in the last
        moments, so a replay from past where the crash event begins answers
        that event alone, as a fresh event; from the stream's very end the
        client has that event already, and gets nothing more. None for any
        other stream or offset."""
        if self.meta.state != "interrupted" or offset == self.meta.end:
            return None
        tail = self.meta.on_crash.encode()
        begins = self.meta.end - len(tail)
        return b"\n\n" + tail if offset > begins else None

    async def follow(self, offset: int):
        """The bytes from `offset`, then each new one as it comes, until the
        stream ends (or drops what this reader has not read yet: the reader
        reconnects, and learns where the stream now starts)."""
        self.followers += 1
        me = object()
        try:
            while True:
                self._readers[me] = offset
                changed = self._changed
                if offset < self.meta.start:
                    return
                if offset < self.meta.end:
                    data = await self.read(offset)
                    if not data:
                        return
                    offset += len(data)
                    yield data
                    continue
                if not self.live:
                    return
                await changed.wait()
        finally:
            self._readers.pop(me, None)
            self.followers -= 1
            if self.followers == 0:
                self.release_memory()


def _pread(path: Path, at: int, most: int) -> bytes:
    with open(path, "rb") as f:
        return os.pread(f.fileno(), most, at)
