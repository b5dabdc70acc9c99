"""Router mode's model processes, slot by slot: starting one (its flags),
what it reports on its pipe (stages, then ready), its exit however it
comes (before it was ready: the load failed; after: unloaded, and under
--isolate started again), its stop (drained first, killed when it does not
exit in time), the process that downloads a model the library lacks, and
stopping them all at shutdown; and the events that tell listeners of it.

`Processes` is the base of `Manager` (manager.py), which decides what
loads, where requests go and what is evicted. The manager provides what
a process's life reports to or asks of it: `_changed` (a slot's row
changed), `_let_go` (this node no longer serves a model), `_preload`,
`refresh` (the library), `hop_headers` and `leave`.

Runs on the server's event loop; each child's reader thread hands its
lines and its exit to the loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import signal
import time
from typing import Any

from serving.router.catalog import Entry
from serving.router.child import ChildProcess
from serving.router.slots import LoadCalledOff, LoadFailed, Settings, Slot, exit_reason, folder_name, settle

log = logging.getLogger("hearth.router")
RESTARTS_MAX, RESTART_WINDOW_S = 5, 60.0  # --isolate: a process that keeps exiting is not started again
# How long a loaded process has to answer /health (its event loop, never its engine's work) before it is judged
# hung: stopped, or deadlocked.
HEALTH_S = 10.0


class Processes:
    def __init__(self, settings: Settings, usable_bytes: int):
        self.settings = settings
        self.usable_bytes = usable_bytes
        self.key = secrets.token_urlsafe(24)  # what the children accept
        self.slots: dict[str, Slot] = {}
        self.fetching: dict[str, Entry] = {}  # repo ids being downloaded by their process (POST /models/load)
        self.http: Any = None  # the connection pool to the children (httpx, made on the server's loop)
        self._released: asyncio.Event | None = None  # set when a request ends or a model goes (`_wake`)
        self._listeners: set[asyncio.Queue] = set()
        self._restarted: dict[str, list[float]] = {}  # model -> when its process was started again (--isolate)
        self.stopping = False  # the server is shutting down: no model process is started again
        self._probes: dict[ChildProcess, asyncio.Future] = {}  # processes asked whether they still answer

    # -- what the manager provides -------------------------------------------
    def _changed(self, slot: Slot) -> None:
        raise NotImplementedError

    def _let_go(self, slot: Slot) -> None:
        raise NotImplementedError

    async def _preload(self, name: str) -> None:
        raise NotImplementedError

    async def refresh(self) -> None:
        raise NotImplementedError

    def hop_headers(self, slot: Slot) -> dict:
        raise NotImplementedError

    def leave(self) -> None:
        raise NotImplementedError

    # -- events --------------------------------------------------------------
    def listen(self) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(maxsize=1000)
        self._listeners.add(queue)
        return queue

    def listening(self, queue: asyncio.Queue) -> bool:
        """False once the router gave up on a listener that stopped reading."""
        return queue in self._listeners

    def unlisten(self, queue: asyncio.Queue) -> None:
        self._listeners.discard(queue)

    def _emit(self, kind: str, data: dict) -> None:
        for queue in list(self._listeners):
            if queue.full():  # a listener that stopped reading loses its stream, not the router its memory
                self._listeners.discard(queue)
                continue
            queue.put_nowait((kind, data))

    # -- the children --------------------------------------------------------
    def client(self):
        """One connection pool to the children, made on the server's event loop."""
        if self.http is None:
            import httpx

            timeout = httpx.Timeout(connect=10.0, read=self.settings.request_timeout_s, write=60.0, pool=None)
            self.http = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=None,
                                                                               max_keepalive_connections=64))
        return self.http

    def went_silent(self, slot: Slot) -> None:
        """A request waited --child-timeout for a byte from `slot`'s process: ask its /health, and kill a
        process that does not answer that either, so the next request loads the model afresh rather than
        waiting as long again (the process's exit gives its other requests their error). One that
        answers is only slow, and runs on."""
        child = slot.child
        if child is None or slot.remote is not None or slot.status != "loaded" or child in self._probes:
            return
        probe = asyncio.ensure_future(self._probe(slot, child))
        self._probes[child] = probe
        probe.add_done_callback(lambda _: self._probes.pop(child, None))

    async def _probe(self, slot: Slot, child: ChildProcess) -> None:
        if await self.answers(slot) or slot.child is not child:
            return
        slot.error = (f"its process stopped answering (nothing for --child-timeout, then no answer to /health "
                      f"within {HEALTH_S:g}s), and was killed; it is loaded again on the next request")
        log.warning("%s: %s", slot.id, slot.error)
        child.kill()

    async def answers(self, slot: Slot) -> bool:
        """Whether `slot`'s process answers /health within HEALTH_S."""
        import httpx

        try:
            await self.client().get(f"{slot.url}/health", headers=self.hop_headers(slot), timeout=HEALTH_S)
        except httpx.HTTPError:
            return False
        return True

    def _wake(self) -> None:
        """Loads waiting for room look again (a request ended, a model went away)."""
        if self._released is not None:
            self._released.set()

    def share_flag(self, flag: str, value: str) -> None:
        """Hand every model's process started from now on `flag value` (a
        shared serve flag the router learnt after its start), in place of
        the value it had."""
        args, out = list(self.settings.child_args), []
        while args:
            name = args.pop(0)
            if name == flag:
                args.pop(0)
            else:
                out.append(name)
        self.settings = dataclasses.replace(self.settings, child_args=(*out, flag, value))

    # -- start ---------------------------------------------------------------
    def _start(self, slot: Slot) -> None:
        loop = asyncio.get_running_loop()
        slot.status, slot.stage, slot.percent, slot.error, slot.exit_code = "loading", "starting", 0, None, None
        slot.ready = asyncio.Event()
        slot.exited = asyncio.Event()
        slot.port = None
        args = [slot.entry.ref, "--model-id", slot.id, "--host", "127.0.0.1", "--port", "0", "--no-worker",
                *self.settings.child_args, *slot.entry.preset.child_args()]
        share = self.settings.memory_share(slot.entry.estimated_bytes(self.usable_bytes))
        if share and "memory-budget" not in slot.entry.preset.flags:
            args += ["--memory-budget", str(share)]
        if self.settings.cache_root and "ssd-cache" not in slot.entry.preset.flags:
            args += ["--ssd-cache", f"{self.settings.cache_root}/{folder_name(slot.id)}"]
        holder: list[ChildProcess] = []

        def on_line(line: dict) -> None:
            loop.call_soon_threadsafe(self._on_line, slot, holder, line)

        def on_exit(code: int) -> None:
            loop.call_soon_threadsafe(self._on_exit, slot, holder, code)

        try:
            child = ChildProcess(args, self.key, on_line, on_exit, slot.id)
        except OSError as exc:
            self._fail(slot, f"could not start its process: {exc}")
            return
        holder.append(child)
        slot.child = child
        log.info("loading %s (pid %d)", slot.id, child.pid)
        self._changed(slot)
        loop.call_later(self.settings.start_timeout_s, self._start_timed_out, slot, child)

    def _on_line(self, slot: Slot, holder: list, line: dict) -> None:
        if slot.child is not (holder[0] if holder else None):
            return  # an earlier process of this slot
        event = line.get("event")
        if event == "ready" and isinstance(line.get("port"), int):
            slot.port = line["port"]
            model = line.get("model")
            slot.info = model if isinstance(model, dict) else {}
            slot.status, slot.stage, slot.percent = "loaded", "ready", 100
            slot.loaded_at = slot.last_used = time.time()
            slot.ready.set()
            log.info("%s loaded (port %d)", slot.id, slot.port)
            self._emit("progress", {"model": slot.id, "stage": "ready", "percent": 100})
            self._changed(slot)
        elif event == "stage":
            slot.stage = str(line.get("stage") or slot.stage)
            percent = line.get("percent")
            slot.percent = max(0, min(100, int(percent))) if isinstance(percent, (int, float)) else slot.percent
            data = {"model": slot.id, "stage": slot.stage, "percent": slot.percent}
            for key in ("message", "download"):
                if key in line:
                    data[key] = line[key]
            self._emit("progress", data)
        elif event == "error":
            slot.error = str(line.get("message") or "unknown error")

    def _on_exit(self, slot: Slot, holder: list, code: int) -> None:
        child = holder[0] if holder else None
        if slot.child is not child:
            return
        was, asked = slot.status, slot.unloading
        stopped = asked and code == -signal.SIGTERM  # as asked: a process still loading ends on SIGTERM itself
        slot.child, slot.port, slot.exit_code, slot.unloading = None, None, None if stopped else code, False
        self._wake()
        if was == "loading" and not asked:
            reason = slot.error or exit_reason(code)
            # Killed (kill -9, the OOM killer), the load may well work next time: not held against it.
            self._fail(slot, f"its process exited before it was ready ({reason})", remember=code != -signal.SIGKILL)
        else:
            if code not in (0, None) and not slot.error and not asked:
                slot.error = f"its process exited ({exit_reason(code)})"
                log.warning("%s: %s", slot.id, slot.error)
            slot.status = "unloaded"
            slot.ready.set()
        if not asked:
            slot.last_exit = {"reason": exit_reason(code), "at": time.time()}
        slot.exited.set()
        self._changed(slot)
        self._let_go(slot)
        if self.settings.isolated and was == "loaded" and not asked:
            self._restart(slot)

    def _restart(self, slot: Slot) -> None:
        """--isolate: the model's process exited while serving; start it
        again at once, unless it did so RESTARTS_MAX times within
        RESTART_WINDOW_S (then the next request that names it loads it)."""
        if self.stopping:
            return
        now = time.monotonic()
        recent = self._restarted.setdefault(slot.id, [])
        recent[:] = [t for t in recent if now - t < RESTART_WINDOW_S]
        if len(recent) >= RESTARTS_MAX:
            log.error("%s: its process exited %d times within %.0fs; not starting it again until a request "
                      "names it", slot.id, len(recent) + 1, RESTART_WINDOW_S)
            return
        recent.append(now)
        slot.restarts += 1
        log.warning("%s: starting its process again (restart %d)", slot.id, slot.restarts)
        asyncio.ensure_future(self._preload(slot.id))

    def _fail(self, slot: Slot, message: str, remember: bool = True) -> None:
        """The load failed; `remember`: a request in the next FAILED_RETRY_S is told so at once (manager.py)."""
        slot.status, slot.error, slot.port = "failed", message, None
        slot.failed_at = time.monotonic() if remember else None
        self._wake()
        log.warning("loading %s failed: %s", slot.id, message)
        slot.ready.set()
        slot.exited.set()
        self._emit("progress", {"model": slot.id, "stage": "failed", "percent": slot.percent, "message": message})
        self._changed(slot)
        self._let_go(slot)

    def _start_timed_out(self, slot: Slot, child: ChildProcess) -> None:
        if slot.child is child and slot.status == "loading":
            slot.error = f"it did not load within {self.settings.start_timeout_s:g}s (--child-start-timeout)"
            child.kill()

    async def _wait_ready(self, slot: Slot) -> None:
        ready = slot.ready
        try:
            await asyncio.wait_for(ready.wait(), self.settings.start_timeout_s + 5)
        except asyncio.TimeoutError:
            raise LoadFailed(f"model {slot.id!r} did not load within {self.settings.start_timeout_s:g}s") from None
        if slot.called_off is ready:
            raise LoadCalledOff(f"model {slot.id!r} was unloaded (POST /models/unload) while it was loading; "
                                "send the request again to load it")
        if slot.status == "failed":
            raise LoadFailed(f"model {slot.id!r} failed to load: {slot.error}")

    # -- download ------------------------------------------------------------
    async def _download(self, slot: Slot) -> None:
        """Fetch a repo the library lacks in a process of its own (its
        progress reported like a load's), then find it in the library."""
        if slot.fetch is None:
            slot.fetch = asyncio.ensure_future(self._run_download(slot))
        task = slot.fetch
        try:
            await asyncio.shield(task)
        finally:
            if task.done() and slot.fetch is task:
                slot.fetch = None

    async def _run_download(self, slot: Slot) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        slot.status, slot.stage, slot.percent, slot.error, slot.exit_code = "loading", "downloading", 0, None, None
        holder: list[ChildProcess] = []

        def on_line(line: dict) -> None:
            loop.call_soon_threadsafe(self._on_line, slot, holder, line)

        def on_exit(code: int) -> None:
            loop.call_soon_threadsafe(settle, done, code)

        try:
            child = ChildProcess([slot.entry.ref, "--download-only"], self.key, on_line, on_exit, slot.id)
        except OSError as exc:
            self.fetching.pop(slot.id, None)
            self._fail(slot, f"could not start its download: {exc}")
            raise LoadFailed(f"model {slot.id!r}: {slot.error}") from None
        holder.append(child)
        slot.child = child
        self._changed(slot)
        code = await done
        slot.child = None
        if code != 0:
            self.fetching.pop(slot.id, None)  # gone from the list at the next scan
            self._fail(slot, slot.error or f"downloading it failed ({exit_reason(code)})")
            raise LoadFailed(f"model {slot.id!r} could not be downloaded: {slot.error}")
        slot.status, slot.stage = "unloaded", None
        await self.refresh()  # the library has it now: its entry describes the files on disk
        self._changed(slot)

    # -- stop ----------------------------------------------------------------
    async def _stop(self, slot: Slot) -> None:
        child = slot.child
        if child is None:
            return
        slot.unloading = True
        self._changed(slot)
        if await self._drain(slot):
            child.terminate()  # exits (what is still running is aborted)
        else:
            child.kill()  # a hung process would not act on a SIGTERM either
        await self._wait_exit(slot)

    async def _drain(self, slot: Slot) -> bool:
        """Before a loaded process is stopped: it finishes its running
        requests and writes its prompt cache to the SSD tier (POST
        /admin/drain), so the next start of the model finds it warm; what it
        reports is kept (`last_drain`). A process that does not answer is
        stopped all the same; False when it does not answer /health (hung:
        waiting for its drain would take minutes for nothing)."""
        if slot.port is None or slot.status != "loaded":
            return True
        import httpx

        if not await self.answers(slot):
            log.warning("%s: no answer to /health within %gs; killing it", slot.id, HEALTH_S)
            return False

        try:
            reply = await self.client().post(
                f"{slot.url}/admin/drain", headers=self.hop_headers(slot),
                json={"drain_seconds": self.settings.drain_s, "flush_seconds": self.settings.flush_s},
                timeout=self.settings.drain_s + self.settings.flush_s + 10.0)
            report = reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("%s: draining it before the stop failed (%s); stopping it all the same", slot.id, exc)
            return True
        if reply.status_code != 200:
            log.warning("%s: its drain before the stop answered %d: %s", slot.id, reply.status_code,
                        reply.text[:200])
        elif isinstance(report, dict) and "drained" in report:
            slot.last_drain = {**report, "at": time.time()}
            log.info("%s drained: %s prompt-cache entries written to the SSD tier", slot.id,
                     report.get("demotions", 0))
        return True

    async def _wait_exit(self, slot: Slot) -> None:
        child = slot.child
        try:
            await asyncio.wait_for(slot.exited.wait(), self.settings.stop_timeout_s)
        except asyncio.TimeoutError:
            log.warning("%s did not stop within %.0fs; killing it", slot.id, self.settings.stop_timeout_s)
            if child is not None:
                child.kill()
            await slot.exited.wait()

    def stop_all(self, timeout_s: float) -> None:
        """Blocking, at shutdown: every child drains and flushes, or is killed."""
        children = [s.child for s in self.slots.values() if s.child is not None]
        self.leave()
        for child in children:
            child.terminate()
        deadline = time.monotonic() + timeout_s
        for child in children:
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except Exception:
                child.kill()
