"""How the resumable streams keep within their bounds (`Streams` in
store.py is one): each finished stream is kept `ttl_s`, all of them at
most `total` bytes; a new stream is refused while live ones hold so much
that it could not grow to `cap`, and as live streams grow, finished ones
are dropped oldest first, then the growing stream's own oldest events
(`Stream.trim`). A collector on the event loop forgets what has expired.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import asyncio
import time

from serving.streams.disk import Writer, forget
from serving.streams.log import Stream

GC_EVERY_S = 5.0


class StreamRefused(Exception):
    """A request the store cannot take, with the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


class Bounds:
    """The bookkeeping half of `Streams`: what it holds, and dropping what must go."""
    by_id: dict[str, Stream]
    gone: list[Stream]
    ttl_s: float
    cap: int
    total: int
    writer: Writer | None
    _held: int
    _gc_task: asyncio.Task | None
    _claims: dict[str, asyncio.Lock]

    def _bytes(self) -> int:
        return sum(s.end - s.start for s in [*self.by_id.values(), *self.gone])

    def _expired(self, stream: Stream, now: float) -> bool:
        return not stream.live and stream.meta.ended_at is not None and now - stream.meta.ended_at > self.ttl_s

    def _make_room(self) -> None:
        """Drop finished streams, oldest first, until the total is under its cap;
        refuse a new one when live streams alone hold it."""
        excess = self._drop_finished(self._bytes() + self.cap - self.total)
        if excess > 0 and self._bytes() + self.cap > self.total:
            raise StreamRefused(f"resumable streams hold {self._bytes()} bytes and each may grow to {self.cap}: "
                                f"over the total cap ({self.total}); retry later or without X-Conversation-Id",
                                status=503)

    def _drop_finished(self, excess: int) -> int:
        """Forget finished streams nobody follows, oldest first, until `excess`
        bytes are gone; what is left of `excess`."""
        if excess <= 0:
            return excess
        for stream in sorted((s for s in self.by_id.values() if not s.live and s.followers == 0),
                             key=lambda s: s.meta.ended_at or 0):
            if excess <= 0:
                break
            excess -= stream.end - stream.start
            self._forget(stream)
        return excess

    def _hold_total(self, growing: Stream, added: int) -> None:
        """Keep all streams within `total` as `growing` grows by `added` bytes:
        finished streams go first, then `growing`'s oldest events. The exact
        count walks every stream, so it is taken only when the bound kept
        since the last count could be over the cap."""
        self._held += added
        if self._held <= self.total:
            return
        excess = self._drop_finished(self._bytes() - self.total)
        if excess > 0:
            growing.trim(excess)
            self._dirty(growing)
        self._held = self._bytes()

    def _forget(self, stream: Stream) -> None:
        if self.by_id.get(stream.meta.conversation_id) is stream:
            del self.by_id[stream.meta.conversation_id]
        forget(stream)

    def _dirty(self, stream: Stream) -> None:
        if self.writer is not None:
            self.writer.mark(stream)

    def _start_gc(self) -> None:
        """Run the collector on the event loop while there is anything to collect."""
        if (self._gc_task is None or self._gc_task.done()) and (self.by_id or self.gone):
            self._gc_task = asyncio.ensure_future(self._gc_loop())

    async def _gc_loop(self) -> None:
        while self.by_id or self.gone:
            await asyncio.sleep(GC_EVERY_S)
            self.collect()

    def collect(self) -> None:
        """Forget streams past their time, and replaced ones nobody follows."""
        now = time.time()
        for stream in list(self.by_id.values()):
            if self._expired(stream, now) and stream.followers == 0:
                self._forget(stream)
        for stream in list(self.gone):
            if not stream.live and stream.followers == 0:
                self.gone.remove(stream)
                forget(stream)
        for conversation_id, lock in list(self._claims.items()):
            if not lock.locked():
                del self._claims[conversation_id]
