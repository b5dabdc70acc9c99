"""Running a serving process, in either mode: daphne on the reactor with a
drain on SIGINT/SIGTERM, the job worker beside it, and the exit.

`Work` is what the drain waits for and then stops: the engine in
single-model mode (`EngineWork`: abort, flush the prompt cache to the SSD
tier), every model's process in router mode (`hearth/router_mode.py`).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

from hearth.root import RUNTIME as runtime
from inference.engine.engine import Engine, EngineConfig

log = logging.getLogger("hearth.serve")
SOCKET_MESSAGE_BYTES = 4 << 20  # a socket frame; history goes out in pages far below this

class Work:
    """What a draining server waits for, then stops."""

    def busy(self) -> bool:
        return False

    def close(self, flush: bool) -> None:
        """Stop; with `flush`, keep what should survive (prompt caches)."""

    def draining(self) -> None:
        """The drain begins: new requests are refused from now on."""

    def closing(self) -> str:
        """What `close(flush=True)` does and the most it takes, as the shutdown's log line says it."""
        return ""


class EngineWork(Work):
    def __init__(self, engine: Engine, flush_seconds: float):
        self.engine, self.flush_seconds = engine, flush_seconds

    def busy(self) -> bool:
        return self.engine.busy

    def closing(self) -> str:
        if self.engine.ssd is None:
            return ""
        return f"; then the prompt cache is written to the SSD tier, at most {self.flush_seconds:.0f}s"

    def draining(self) -> None:
        self.engine.stop_grammar_compiles()  # a request waiting for its grammar is answered now, not at its budget

    def close(self, flush: bool) -> None:
        engine = self.engine
        try:
            engine.close(drain_seconds=0)
            if engine.ssd is not None and flush:
                durable, report = engine.flush_cache(self.flush_seconds)
                log.info("ssd cache: %d snapshot(s) written in %d ms; %d entries on disk", report["flushedSnapshots"],
                         report["elapsedMs"], report["entries"])
                if not durable:
                    log.warning("ssd cache: some snapshots were not written before shutdown (%d pending, %d failed, "
                                "%d lost)", report["pendingSnapshots"], report["failedSpills"],
                                report["missingSnapshots"])
        finally:
            if engine.ssd is not None:
                engine.ssd.close()


def engine_config(opts: dict) -> EngineConfig:
    return EngineConfig(
        batch=opts["batch"], prefill_chunk=opts["prefill_chunk"], max_context=opts["max_context"],
        memory_budget=opts["memory_budget"], kv_budget=opts["kv_budget"], prompt_cache_bytes=opts["prompt_cache_bytes"],
        ssd_cache=opts["ssd_cache"], ssd_cache_bytes=opts["ssd_cache_bytes"], kv_quant=opts["kv_quant"],
        keep_dtype=opts["keep_dtype"], draft_kind=opts.get("draft_kind"), draft_model=opts.get("draft_model"),
        draft_tokens=opts.get("draft_tokens"), jump_forward=not opts.get("no_jump_forward"))


def open_streams(opts: dict, record: bool = True) -> None:
    """The resumable streams, on disk under HEARTH_HOME/streams (what an
    earlier run left is replayable again). A router's model process keeps
    none (`record=False`): the router records them."""
    from core import home
    from serving.streams.store import Streams

    if not record:
        runtime.streams = Streams(None, record=False)
        return
    runtime.streams = Streams(home.streams(), ttl_s=opts["stream_ttl"], cap=opts["stream_max_bytes"],
                              total=opts["streams_max_bytes"])
    runtime.streams.open()
    from django.conf import settings

    if settings.HEARTH_REDIS_URL:  # every web node on this Redis replays, follows and stops every stream
        from serving.streams.shared import Shared

        assert runtime.streams.owner is not None
        runtime.streams.shared = Shared(settings.HEARTH_REDIS_URL, runtime.streams.owner.name,
                                        ttl_s=opts["stream_ttl"], cap=opts["stream_max_bytes"])


def start_services(no_worker: bool):
    """What a top-level server runs beside itself: interrupted downloads
    resumed, the machine measured, stray workers stopped and (unless
    `no_worker`) a supervised job worker. Returns the supervisor or None."""
    from hub.downloads import resume_interrupted
    from jobs.supervisor import WorkerSupervisor, stop_strays

    _measure_machine_soon()
    resume_interrupted()  # downloads whose process died continue from their partial files
    try:
        stop_strays()  # a worker an earlier, killed server left behind (with --no-worker too)
    except Exception:  # worth a log line, never a server that fails to start
        log.exception("looking for stray job workers failed")
    if no_worker:
        return None
    from jobs.runner import mark_zombies

    mark_zombies()
    supervisor = WorkerSupervisor(server_stopping=lambda: runtime.draining)
    supervisor.start()
    return supervisor


def stop_services(supervisor) -> None:
    if supervisor is not None:
        supervisor.stop()
    if runtime.options.templates is not None:
        runtime.options.templates.close()


def check_port(host: str, port: int) -> None:
    """Refuse, before anything is started (the worker, the demo's training,
    a model), a port this process cannot listen on: daphne's own bind comes
    last and, failing, would only stop the reactor. Bound as twisted binds
    (address reuse on), so connections of a stopped server in TIME_WAIT do
    not count."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ListenError(listen_message(host, port, exc.strerror or str(exc))) from None


class ListenError(Exception):
    pass


def listen_message(host: str, port: int, reason: str) -> str:
    hint = "another program (another hearth serve?) listens there; stop it, or " if "in use" in reason.lower() else ""
    return f"cannot listen on {host}:{port} ({reason}): {hint}choose another port with --port N (make serve PORT=N)"


def exit_now(status: int = 0) -> None:
    """End a server whose shutdown is done (the engine, the streams, the job
    worker and the sandboxes have stopped; what must outlive it is written).
    Python's own exit would wait for every non-daemon thread, forever if one
    is blocked, and then run the native libraries' static destructors, one of
    which aborted a stopping server once (`terminate called without an active
    exception`: SIGABRT where a clean stop should exit 0). So the process
    ends here, as the old exit watchdog ended a stuck one."""
    deadline = time.monotonic() + 0.5  # idle pool threads told to end (run_daphne) are given a moment
    for thread in threading.enumerate():
        if not thread.daemon and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threading.enumerate() if not t.daemon and t.is_alive()
             and t is not threading.current_thread()]
    if stuck:
        log.info("exiting with threads %s left running", ", ".join(stuck))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _measure_machine_soon() -> None:
    """Measure this machine's bandwidths (once, or again if the cached
    reading was taken while the machine was busy) off the request path."""

    from hub.library import this_machine

    def measure():
        try:
            this_machine(remeasure_busy=True)
        except Exception:
            log.exception("measuring this machine failed; /fit will try again")

    threading.Thread(target=measure, name="measure-machine", daemon=True).start()


def run_daphne(work: Work, host: str, port: int, drain_seconds: float, label: str,
               on_listen: Callable[[int], None] | None = None, on_start: Callable[[], None] | None = None) -> int:
    """Serve until a signal, then drain: stop listening, answer 503 to new
    requests, wait for running ones (up to `drain_seconds`), close `work`.
    `on_start` runs on the event loop once it runs; `on_listen(port)` once
    the port listens. A parent that goes away (router mode's child) drains
    this process too. Answers the exit status: 1 when the port could not
    be listened on (taken since `check_port`), 0 otherwise."""
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server
    from twisted.internet import reactor

    from core import http_guard, ws_guard
    from hearth.asgi import application
    from hearth.request_threads import POOL

    http_guard.install()  # body caps and header/body/idle timeouts on every connection
    ws_guard.install()  # sockets written and read at their client's pace
    loop = reactor._asyncioEventloop
    # Prompt builds and tokenizing run on the loop's default executor; on a
    # 2-core machine asyncio would give it 6 threads.
    io = ThreadPoolExecutor(32, thread_name_prefix="hearth-io")
    loop.set_default_executor(io)
    ports, refused = [], []

    class HearthServer(Server):
        def listen_error(self, failure):
            refused.append(failure.getErrorMessage())
            log.error("%s", listen_message(host, port, refused[0]))
            finish(flush=False)

        def listen_success(self, port_obj):
            ports.append(port_obj)
            address = port_obj.getHost()
            shown = f"[{address.host}]" if ":" in address.host else address.host
            own = "127.0.0.1" if address.host in ("0.0.0.0", "::") else shown
            runtime.local_url = runtime.local_url or f"http://{own}:{address.port}"
            log.info("Hearth serving %s at http://%s:%s", label, shown, address.port)
            if on_listen is not None:
                on_listen(address.port)

    server = HearthServer(application, endpoints=build_endpoint_description_strings(host=host, port=port),
                          signal_handlers=False, application_close_timeout=5,
                          websocket_max_message_size=SOCKET_MESSAGE_BYTES)
    deadline = [0.0]

    def finish(flush: bool = True):
        try:
            runtime.streams.shutdown()  # a generation still running ends with an error event, on disk
        except Exception:
            log.exception("shutdown: the resumable streams were not all written")
        try:
            work.close(flush)
        except Exception:
            log.exception("shutdown: the engine did not stop cleanly")
        finally:
            server.stop()

    def poll():
        idle = not work.busy() and runtime.inflight == 0 and runtime.streams.live_count() == 0
        if idle or time.monotonic() > deadline[0]:
            finish()
        else:
            http_guard.clock().callLater(0.05, poll)

    def drain():
        if runtime.draining and not runtime.drained_on_request:  # second signal: stop now
            finish(flush=False)
            return
        runtime.drained_on_request = False  # drained by POST /admin/drain: this signal still flushes
        log.info("shutting down: finishing %d running request(s) and %d resumable stream(s) no client reads, "
                 "at most %.0fs%s", runtime.inflight, runtime.streams.unread_count(), drain_seconds, work.closing())
        runtime.draining = True
        try:
            work.draining()
        except Exception:
            log.exception("shutdown: letting go of shared state failed")
        deadline[0] = time.monotonic() + drain_seconds
        for p in ports:
            p.stopListening()
        poll()

    def on_signal(signum, frame):
        reactor.callFromThread(drain)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if on_start is not None:
        loop.call_soon(on_start)
    try:
        server.run()
    finally:  # their idle threads end now; exit_now names only a thread still busy
        io.shutdown(wait=False)
        POOL.close()
        SyncToAsync.single_thread_executor.shutdown(wait=False)  # asgiref's, for sync calls outside a request
    return 1 if refused else 0
