"""What the router keeps per model (`Slot`), its settings, the refusals it
answers with (each with its HTTP status), and the helpers they share."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from core import procs
from inference.engine.errors import EngineError
from serving.router.catalog import Entry
from serving.router.child import ChildProcess
from serving.router.remotes import RemoteHost


class RouterError(EngineError):
    """A refusal with an HTTP status, rendered in the caller's protocol like
    the engine's own errors."""

    status = 503
    type = "server_error"
    code = "model_unavailable"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ModelNotFound(RouterError):
    status = 400
    type = "invalid_request_error"
    code = "model_not_found"
    param = "model"


class NoCapacity(RouterError):
    code = "no_free_model_slot"


class NotEnoughMemory(RouterError):
    code = "insufficient_memory"


class LoadFailed(RouterError):
    code = "model_load_failed"


class LoadCalledOff(RouterError):
    """The load a request waited for was ended by POST /models/unload."""
    code = "model_unloaded"


class Downloading(RouterError):
    """POST /models/unload of a model whose files are still being downloaded."""
    status = 409
    type = "invalid_request_error"
    code = "model_downloading"


class RemoteModel(RouterError):
    """Asked to load or unload a model another machine serves."""
    status = 400
    type = "invalid_request_error"
    code = "remote_model"


@dataclass(frozen=True)
class Settings:
    models_max: int
    idle_unload_s: float = 0.0  # 0: never
    start_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    stop_timeout_s: float = 150.0  # drain + SSD flush of an evicted child before it is killed
    slot_wait_s: float = 120.0  # how long a load waits for a busy model to finish before it is refused
    child_args: tuple[str, ...] = ()  # serve flags every child gets, before its preset's
    cache_root: str | None = None  # each child's SSD prompt-cache tier: <cache_root>/<model>
    memory_check: bool = True
    memory_total: int | None = None  # what all children may take together (--memory-budget, or 3/4 of RAM)
    isolated: bool = False  # `hearth serve MODEL --isolate`: a model process that exits unasked starts again
    drain_s: float = 30.0  # how long a child stopped by the router lets its running requests finish
    flush_s: float = 120.0  # and then writes its prompt cache to the SSD tier

    def memory_share(self, estimate: int | None) -> int | None:
        """A child's `--memory-budget`: an equal share of the total among the
        models that may be loaded at once, or the model's own estimate when
        that is larger (the router's free-memory check admits such a load),
        so the children's batches, each sized to its budget, fit together."""
        if not self.memory_total:
            return None
        return max(self.memory_total // max(self.models_max, 1), estimate or 0)


@dataclass
class Slot:
    entry: Entry
    status: str = "unloaded"  # loaded | loading | unloaded | failed
    child: ChildProcess | None = None
    port: int | None = None
    stage: str | None = None
    percent: int = 0
    error: str | None = None
    exit_code: int | None = None
    unloading: bool = False
    pinned: bool = False
    users: int = 0  # requests holding or waiting for it, and loads asked for alone
    loaders: int = 0  # of those, the loads asked for alone (POST /models/load, a preload): no request in flight
    last_used: float | None = None
    loaded_at: float | None = None
    info: dict = field(default_factory=dict)  # the child's own /v1/models row
    fetch: asyncio.Future | None = None  # its download, while the library lacks it
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # a new one per start of its process
    called_off: asyncio.Event | None = None  # the `ready` of a load POST /models/unload ended: its waiters fail
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    remote: RemoteHost | None = None  # served by another machine's `hearth serve` (serving/router/remotes.py)
    restarts: int = 0  # times it was started again after its process exited unasked (--isolate)
    last_exit: dict | None = None  # how its process last ended unasked: {"reason", "at"}
    last_drain: dict | None = None  # what its last drain before a stop reported (POST /admin/drain)
    failed_at: float | None = None  # when its last load failed (time.monotonic())

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def url(self) -> str:
        return self.remote.url if self.remote is not None else f"http://127.0.0.1:{self.port}"

    def status_object(self) -> dict:
        out: dict = {"value": self.status}
        if self.status == "loading":
            out.update(stage=self.stage or "starting", percent=self.percent)
        if self.error:
            out["error"] = self.error
        if self.exit_code:  # a process that did not end as asked
            out["exit_code"] = self.exit_code
        if self.unloading:
            out["unloading"] = True
        return out


def available_memory() -> int | None:
    """MemAvailable (Linux), or None where it cannot be read."""
    return procs.proc_bytes("/proc/meminfo", "MemAvailable")


def held(slot: Slot) -> int:
    """The memory a model's process holds, or will once loaded."""
    rss = slot.child.rss_bytes() if slot.child is not None else None
    return rss if rss is not None else slot.entry.estimated_bytes(0) or 0


def settle(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def folder_name(model_id: str) -> str:
    return model_id.replace("/", "--")


def exit_reason(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.1f} GiB"
