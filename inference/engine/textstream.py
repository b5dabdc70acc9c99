"""Hold back streamed text that could still turn into a stop string."""
from __future__ import annotations


class StopMatcher:
    """Feed decoded text in; get back the part that is safe to emit.

    A suffix that is a prefix of some stop string is held until the next
    text decides it. Once a stop string appears, everything before it is
    released and `stopped` turns true; the stop string itself never is.
    """

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.pending += text
        hits = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            cut, self.matched = min(hits, key=lambda h: h[0])
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        keep = self._held_suffix()
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out

    def _held_suffix(self) -> int:
        # Longest suffix of `pending` that begins some stop string.
        for size in range(min(len(self.pending), max(len(s) for s in self.stops) - 1), 0, -1):
            tail = self.pending[-size:]
            if any(s.startswith(tail) for s in self.stops):
                return size
        return 0
