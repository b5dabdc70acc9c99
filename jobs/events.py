"""A job's event log, appended by the job's child process and read by the
worker and the SSE route: an NDJSON file (one JSON object per line) on one
machine, a Redis stream when HEARTH_REDIS_URL is set. No Django."""
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


STREAM_PREFIX = "hearth:job-events:"
STREAM_TTL_S = 7 * 24 * 3600  # a job's events stay this long after its last one
STREAM_MAXLEN = 100_000  # events kept per job (approximately): a runaway job cannot fill Redis
_clients: dict[str, object] = {}


def redis_client(url: str):
    """One client (and connection pool) per URL per process; thread-safe."""
    client = _clients.get(url)
    if client is None:
        import redis

        client = _clients[url] = redis.Redis.from_url(url)
    return client


class StreamEventLog:
    """A job's events as a Redis stream (one XADD per event), so any web
    node can follow any job. The same interface as EventLog; its cursor is a
    stream id (0, the first read's, means the start). Redis failures are
    raised as OSError, as a file's are."""

    def __init__(self, path: str | Path, url: str):
        self.path = Path(path)  # the job's log path names it: its stem is the job id
        self.key = STREAM_PREFIX + self.path.stem
        self.client = redis_client(url)

    def emit(self, event_type: str, /, **fields) -> dict:
        import redis

        event = {"type": event_type, "ts": time.time(), **fields}
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.xadd(self.key, {"e": json.dumps(event, ensure_ascii=False)}, maxlen=STREAM_MAXLEN,
                          approximate=True)
                pipe.expire(self.key, STREAM_TTL_S)
                pipe.execute()
        except redis.RedisError as exc:
            raise OSError(f"Redis stream {self.key}: {exc}") from exc
        return event

    def read(self, offset: int | str = 0) -> tuple[list[dict], int | str]:
        """Events after stream id `offset`, and the id of the last one."""
        import redis

        try:
            entries = self.client.xrange(self.key, min="-" if offset == 0 else f"({offset}")
        except redis.RedisError as exc:
            raise OSError(f"Redis stream {self.key}: {exc}") from exc
        events = []
        for entry_id, data in entries:
            try:
                events.append(json.loads(data[b"e"]))
            except (KeyError, ValueError):
                events.append({"type": "log", "line": repr(data)})
            offset = entry_id.decode()
        return events, offset


def open_log(path: str | Path, redis_url: str = "") -> EventLog | StreamEventLog:
    """A job's event log: its NDJSON file, or its Redis stream when Hearth runs on Redis."""
    return StreamEventLog(path, redis_url) if redis_url else EventLog(path)
