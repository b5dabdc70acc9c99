"""`hearth serve [MODEL]`: load one model and serve it with daphne. The
composition root: it fills the runtime (config/runtime.py) and starts the
worker beside the server.

On SIGINT/SIGTERM the server stops listening, answers 503 to new requests
on open connections, lets running ones finish (up to --drain-seconds),
aborts what is left, writes pending prompt-cache snapshots to the SSD tier
(up to --flush-seconds) and exits 0. A second signal stops at once.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from huggingface_hub import constants

from config.runtime import RUNTIME as runtime
from config.serving_access import INSECURE_WARNING, AccessError, export_for_children, settle
from core import limits
from core.blas import blas_in_use
from inference.demo.build import DEMO_REPO, Recipe, cached_snapshot
from inference.engine import checks
from inference.engine.engine import Engine, EngineConfig
from inference.engine.errors import EngineError
from inference.protocols.options import Options, ServerDefaults
from inference.protocols.response_store import ResponseStore

log = logging.getLogger("hearth.serve")


def _non_negative(kind, most: float | None = None):
    def parse(text):
        value = kind(text)
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"must be a number of at least 0, got {text}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g}, got {text}")
        return value
    return parse


def _seconds(text):
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


def _bytes(text):
    """A byte count: `1073741824`, `512MiB`, `2G`, `1.5GB` (powers of 1024)."""
    try:
        return limits.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _unit(text):
    value = float(text)
    if not 0 <= value <= 1:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


LIMIT_FLAGS = {  # flag: (Limits field, type, help)
    "--max-body-bytes": ("max_body_bytes", _bytes, "largest request body (default 32MiB); larger ones get 413"),
    "--max-json-depth": ("max_json_depth", _positive, "deepest nesting of arrays and objects in a body (64)"),
    "--max-messages": ("max_messages", _positive, "most messages (turns) in one request (4096)"),
    "--max-prompt-chars": ("max_prompt_chars", _positive,
                           "most characters of messages, tools and template variables in one request (2000000)"),
    "--max-grammar-bytes": ("max_grammar_bytes", _bytes, "largest schema, grammar or regex (64KiB)"),
    "--max-grammar-choices": ("max_grammar_choices", _positive, "most guided_choice entries (1024)"),
    "--max-schema-depth": ("max_schema_depth", _positive, "deepest nesting of a JSON schema (32)"),
    "--grammar-timeout": ("grammar_timeout_s", _seconds, "seconds a request waits for its grammar to compile (10)"),
    "--grammar-cache-bytes": ("grammar_cache_bytes", _bytes, "RAM for compiled grammars (256MiB)"),
    "--template-timeout": ("template_timeout_s", _seconds, "seconds a client chat template may take to render (5)"),
    "--header-timeout": ("header_timeout_s", _seconds, "seconds a request's headers may take to arrive (30)"),
    "--body-timeout": ("body_timeout_s", _seconds, "seconds a request's body may take after its headers (120)"),
    "--idle-timeout": ("idle_timeout_s", _seconds, "seconds an idle keep-alive connection stays open (60)"),
    "--max-socket-text": ("max_socket_text", _positive, "most characters in a dashboard chat message (200000)"),
}


def _add_limit_flags(parser) -> None:
    group = parser.add_argument_group("limits (each also an environment variable; see README, Security)")
    for flag, (name, kind, text) in LIMIT_FLAGS.items():
        group.add_argument(flag, dest=name, type=kind, default=None, help=text)
    group.add_argument("--allow-client-templates", dest="allow_client_templates", action="store_true", default=None,
                       help="let requests bring their own chat template (chat_template_kwargs.chat_template); "
                            "each renders in a separate process with a time budget")


def _limits(opts: dict) -> limits.Limits:
    """The environment's bounds (HEARTH_MAX_BODY_BYTES, …), with the flags over them."""
    given = {name: opts[name] for name, *_ in LIMIT_FLAGS.values() if opts.get(name) is not None}
    if opts.get("allow_client_templates"):
        given["allow_client_templates"] = True
    return dataclasses.replace(limits.from_env(), **given)


class Command(BaseCommand):
    help = "Serve a model (default: the demo) over OpenAI, Anthropic and Responses, with the dashboard and jobs."

    def add_arguments(self, parser):
        parser.add_argument("model", nargs="?", default=None,
                            help=f"a local model directory or a repo id in the HF cache (default {DEMO_REPO})")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8080)
        parser.add_argument("--max-tokens", type=_non_negative(int), default=None,
                            help="default cap on generated tokens when a request sets none")
        parser.add_argument("--temperature", type=_non_negative(float, checks.MAX_TEMPERATURE), default=None)
        parser.add_argument("--top-p", type=_unit, default=None)
        parser.add_argument("--top-k", type=_non_negative(int), default=None)
        parser.add_argument("--keep-dtype", action="store_true",
                            help="serve the stored dtype instead of upcasting to float32 on the CPU")
        parser.add_argument("--drain-seconds", type=_non_negative(float), default=30.0,
                            help="on shutdown, how long running requests may take to finish")
        parser.add_argument("--flush-seconds", type=_non_negative(float), default=120.0,
                            help="on shutdown, how long pending SSD cache snapshots may take to write")
        parser.add_argument("--adapter", "--adapter-path", dest="adapter", default=None, metavar="DIR",
                            help="mount this LoRA adapter at start (id: the folder name) and use it for requests "
                                 "that send no `adapter` field")
        parser.add_argument("--no-worker", action="store_true",
                            help="do not start a job worker beside the server (run `hearth worker` yourself)")
        parser.add_argument("--embeddings", action="store_true",
                            help="answer /v1/embeddings with this model (on by default for embedding models)")
        parser.add_argument("--response-ttl", type=_non_negative(float), default=3600.0,
                            help="seconds a stored Responses turn stays available to previous_response_id")
        access = parser.add_argument_group("access control")
        access.add_argument("--api-key", action="append", default=[], metavar="KEY",
                            help="require this key on every route but /health (repeatable; also HEARTH_API_KEY)")
        access.add_argument("--api-key-file", action="append", default=[], metavar="FILE",
                            help="read keys from FILE, one per line (repeatable)")
        access.add_argument("--insecure-no-auth", action="store_true",
                            help="serve off loopback with no key (anyone who reaches the address can use it)")
        access.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                            help="let pages on ORIGIN call the API from a browser (repeatable; also "
                                 "HEARTH_CORS_ORIGINS, comma-separated)")
        access.add_argument("--allow-path", action="append", default=[], metavar="DIR",
                            help="let requests name files under DIR, besides HEARTH_HOME and the HF cache "
                                 "(repeatable; also HEARTH_ALLOW_PATHS)")
        _add_limit_flags(parser)
        group = parser.add_argument_group("throughput and memory")
        group.add_argument("--batch", type=_positive, default=8,
                           help="rows decoded together by continuous batching (1 = one request at a time)")
        group.add_argument("--prefill-chunk", type=_positive, default=256,
                           help="prompt tokens prefilled per step while other rows decode")
        group.add_argument("--max-context", type=_positive, default=None,
                           help="cap on prompt + generated tokens per request; a prompt that fills it is refused")
        group.add_argument("--memory-budget", type=_bytes, default=None,
                           help="bytes for weights + one request's KV cache; sets the context cap from the model")
        group.add_argument("--prompt-cache-bytes", type=_bytes, default=1 << 30,
                           help="RAM for reusable prompt KV caches (0 turns the cache off; default 1GiB)")
        group.add_argument("--ssd-cache", default=None, metavar="DIR",
                           help="also keep prompt caches in DIR, found again after a restart")
        group.add_argument("--ssd-cache-bytes", type=_bytes, default=16 << 30,
                           help="disk cap of the SSD tier (oldest entries go first; default 16GiB)")
        group.add_argument("--kv-quant", type=int, choices=(4, 8), default=None,
                           help="quantize the KV cache to 4 or 8 bits (runs on the serial lane)")

    def handle(self, *args, **opts):
        try:
            access = settle(opts["host"], opts["api_key"], opts["api_key_file"], opts["cors_origin"],
                            opts["insecure_no_auth"], os.environ, settings.HEARTH_BEHIND_PROXY)
            export_for_children(access, opts["allow_path"])
        except AccessError as exc:
            raise CommandError(str(exc)) from None
        if access.insecure_no_auth:
            log.warning("WARNING: %s", INSECURE_WARNING)
        try:
            bounds = _limits(opts)
        except limits.LimitError as exc:
            raise CommandError(str(exc)) from None
        limits.export(bounds)  # this process, the worker and every child see the same bounds
        log.info("BLAS: %s", blas_in_use())
        call_command("migrate", interactive=False, verbosity=0)
        model_ref = opts["model"] or self._demo_model()
        config = EngineConfig(
            batch=opts["batch"], prefill_chunk=opts["prefill_chunk"], max_context=opts["max_context"],
            memory_budget=opts["memory_budget"], prompt_cache_bytes=opts["prompt_cache_bytes"],
            ssd_cache=opts["ssd_cache"], ssd_cache_bytes=opts["ssd_cache_bytes"], kv_quant=opts["kv_quant"],
            keep_dtype=opts["keep_dtype"])
        engine = Engine(model_ref, config)
        try:
            loaded = engine.start()
        except EngineError as exc:
            raise CommandError(str(exc)) from None
        if opts["adapter"]:
            self._mount_default(engine, opts["adapter"])
        runtime.allowed_hosts = access.allowed_hosts
        runtime.api_keys = access.api_keys
        runtime.cors_origins = access.cors_origins
        runtime.insecure_no_auth = access.insecure_no_auth
        runtime.warning = INSECURE_WARNING if access.insecure_no_auth else None
        runtime.engine = engine
        runtime.started_at = int(time.time())
        runtime.responses = ResponseStore(ttl_s=opts["response_ttl"])
        runtime.embeddings_enabled = opts["embeddings"] or loaded.is_embedding_model
        loaded.grammar_compiler.cache_bytes = bounds.grammar_cache_bytes
        templates = None
        if bounds.allow_client_templates:
            from inference.protocols.template_sandbox import TemplateSandbox

            templates = TemplateSandbox(timeout_s=bounds.template_timeout_s)
            log.warning("client chat templates are allowed: each renders in its own process, at most %gs",
                        bounds.template_timeout_s)
        runtime.options = Options(
            defaults=ServerDefaults(opts["max_tokens"] or None, opts["temperature"], opts["top_p"], opts["top_k"]),
            limits=bounds,
            grammar_enabled=settings.HEARTH_GRAMMAR, templates=templates,
            sse_keepalive=settings.HEARTH_SSE_KEEPALIVE)
        log.info("model %s ready (%s, context %s)", loaded.model_id, loaded.dtype, loaded.context_window)
        from hub.downloads import resume_interrupted
        from hub.locks import record_serving

        marker = record_serving(loaded.path)  # GC in any process keeps this snapshot
        _measure_machine_soon()

        resume_interrupted()  # downloads whose process died continue from their partial files
        from jobs.supervisor import WorkerSupervisor, stop_strays

        try:
            stop_strays()  # a worker an earlier, killed server left behind (with --no-worker too)
        except Exception:  # worth a log line, never a server that fails to start
            log.exception("looking for stray job workers failed")
        supervisor = None
        if not opts["no_worker"]:
            from jobs.runner import mark_zombies

            mark_zombies()
            supervisor = WorkerSupervisor()
            supervisor.start()
        try:
            _run_daphne(engine, opts["host"], opts["port"], opts["drain_seconds"], opts["flush_seconds"])
        finally:
            marker.unlink(missing_ok=True)
            if supervisor is not None:
                supervisor.stop()
            if runtime.options.templates is not None:
                runtime.options.templates.close()
        log.info("stopped")
        _exit_even_if_stuck()

    def _mount_default(self, engine: Engine, folder: str) -> None:
        from jobs.adapters import register

        path = Path(folder).expanduser()
        adapter_id = path.resolve().name
        try:
            result = engine.mount_adapter(adapter_id, str(path), make_default=True)
        except EngineError as exc:
            engine.close(drain_seconds=0)
            raise CommandError(f"--adapter {folder}: {exc}") from None
        register(path, name=adapter_id, mounted=True)
        log.info("adapter %s mounted as the default (%d layers, rank %s)", adapter_id, result["mounted_layers"],
                 result["rank"])

    def _demo_model(self) -> str:
        if cached_snapshot(Path(constants.HF_HUB_CACHE), Recipe()) is None:
            log.info("building the demo model first (about 4 minutes, once)")
            done = subprocess.run([sys.executable, "-m", "config.cli", "make-demo-model"])
            if done.returncode != 0:
                raise CommandError("building the demo model failed; see the output above")
        return DEMO_REPO


def _exit_even_if_stuck(grace_s: float = 10.0) -> None:
    """Python's exit waits for every non-daemon thread, forever if one is
    blocked; a watchdog ends the process if that takes more than `grace_s`.
    The worker and the engine have stopped by now."""
    import threading

    def watchdog():
        time.sleep(grace_s)
        stuck = [t.name for t in threading.enumerate() if not t.daemon and t.is_alive()]
        log.warning("exit blocked for %.0fs by threads %s; exiting anyway", grace_s, ", ".join(stuck) or "?")
        logging.shutdown()
        os._exit(0)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()


def _measure_machine_soon() -> None:
    """Measure this machine's bandwidths (once; cached) off the request path."""
    import threading

    from hub.library import this_machine

    def measure():
        try:
            this_machine()
        except Exception:
            log.exception("measuring this machine failed; /fit will try again")

    threading.Thread(target=measure, name="measure-machine", daemon=True).start()


SOCKET_MESSAGE_BYTES = 4 << 20  # a socket frame; history goes out in pages far below this


def _run_daphne(engine: Engine, host: str, port: int, drain_seconds: float, flush_seconds: float) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server
    from twisted.internet import reactor

    from config.asgi import application
    from core import http_guard

    http_guard.install()  # body caps and header/body/idle timeouts on every connection
    # Prompt builds and tokenizing run on the loop's default executor; on a
    # 2-core machine asyncio would give it 6 threads.
    reactor._asyncioEventloop.set_default_executor(ThreadPoolExecutor(32, thread_name_prefix="hearth-io"))

    ports = []

    class HearthServer(Server):
        def listen_success(self, port_obj):
            ports.append(port_obj)
            address = port_obj.getHost()
            shown = f"[{address.host}]" if ":" in address.host else address.host
            own = "127.0.0.1" if address.host in ("0.0.0.0", "::") else shown
            runtime.local_url = runtime.local_url or f"http://{own}:{address.port}"
            log.info("Hearth serving %s at http://%s:%s", engine.loaded.model_id, shown, address.port)

    server = HearthServer(application, endpoints=build_endpoint_description_strings(host=host, port=port),
                          signal_handlers=False, application_close_timeout=5,
                          websocket_max_message_size=SOCKET_MESSAGE_BYTES)
    deadline = [0.0]

    def finish(flush: bool = True):
        try:
            engine.close(drain_seconds=0)
            if engine.ssd is not None and flush:
                durable, report = engine.flush_cache(flush_seconds)
                log.info("ssd cache flush: %s", report)
                if not durable:
                    log.warning("ssd cache: some snapshots were not written before shutdown")
        except Exception:
            log.exception("shutdown: the engine did not stop cleanly")
        finally:
            if engine.ssd is not None:
                engine.ssd.close()
            server.stop()

    def poll():
        if (not engine.busy and runtime.inflight == 0) or time.monotonic() > deadline[0]:
            finish()
        else:
            reactor.callLater(0.05, poll)

    def drain():
        if runtime.draining:  # second signal: stop now
            finish(flush=False)
            return
        log.info("shutting down: finishing %d running request(s), at most %.0fs",
                 runtime.inflight, drain_seconds)
        runtime.draining = True
        deadline[0] = time.monotonic() + drain_seconds
        for p in ports:
            p.stopListening()
        poll()

    def on_signal(signum, frame):
        reactor.callFromThread(drain)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    server.run()
