"""The NDJSON event log of a job: one JSON object per line, appended by the
job's child process and read by the worker and the SSE route. No Django."""
from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path


class EventLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def emit(self, event_type: str, /, **fields) -> dict:
        event = {"type": event_type, "ts": time.time(), **fields}
        line = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            if self._torn_tail(f):  # a writer killed mid-line: end that line, so this event stays whole
                line = b"\n" + line
            f.write(line)
            f.flush()
            try:
                os.fsync(f.fileno())
            except OSError:  # a log that is not a regular file (a pipe, /dev/null) cannot be synced
                pass
        return event

    def _torn_tail(self, f) -> bool:
        """The file `f` (open to append) ends in a partial line."""
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:  # a pipe or a device has no tail to mend
            return False
        with open(self.path, "rb") as tail:
            tail.seek(-1, os.SEEK_END)
            return tail.read(1) != b"\n"

    def read(self, offset: int = 0) -> tuple[list[dict], int]:
        """Complete events from byte `offset`, and the offset after them (a
        line still being written is left for the next read)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return [], offset
        events, used = [], 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            used += len(line)
            try:
                events.append(json.loads(line))
            except ValueError:
                events.append({"type": "log", "line": line.decode(errors="replace").rstrip()})
        return events, offset + used
