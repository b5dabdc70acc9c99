"""The NDJSON event log of a job: one JSON object per line, appended by the
job's child process and read by the worker and the SSE route. No Django."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


class EventLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def emit(self, event_type: str, /, **fields) -> dict:
        event = {"type": event_type, "ts": time.time(), **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event, ensure_ascii=False) + "\n")
            f.flush()
            try:
                os.fsync(f.fileno())
            except OSError:  # a log that is not a regular file (a pipe, /dev/null) cannot be synced
                pass
        return event

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
