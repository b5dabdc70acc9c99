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
import os
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from config.runtime import RUNTIME as runtime
from config.serving import (
    EngineWork,
    engine_config,
    exit_now,
    open_streams,
    run_daphne,
    start_services,
    stop_services,
)
from config.serving_access import INSECURE_WARNING, AccessError, export_for_children, settle
from core import argtypes, limits
from core.blas import blas_in_use
from inference.demo.build import DEMO_REPO
from inference.engine import checks, hlg
from inference.engine.engine import Engine
from inference.engine.errors import EngineError
from inference.engine.speech import Transcriber
from inference.protocols.options import Options, ServerDefaults
from inference.protocols.response_store import RedisResponseStore, ResponseStore
from inference.router import child

log = logging.getLogger("hearth.serve")


def _non_negative(kind, most: float | None = None):
    return argtypes.flag(argtypes.non_negative(kind, most))


_seconds = argtypes.flag(argtypes.seconds)
_bytes = argtypes.flag(argtypes.byte_count)
_positive = argtypes.flag(argtypes.positive)
_unit = argtypes.flag(argtypes.unit)


LIMIT_FLAGS = {  # flag: (Limits field, type, help)
    "--max-body-bytes": ("max_body_bytes", _bytes, "largest request body (default 32MiB); larger ones get 413"),
    "--max-json-depth": ("max_json_depth", _positive, "deepest nesting of arrays and objects in a body (64)"),
    "--max-messages": ("max_messages", _positive, "most messages (turns) in one request (4096)"),
    "--max-prompt-chars": ("max_prompt_chars", _positive,
                           "most characters of messages, tools and template variables in one request (2000000)"),
    "--max-grammar-bytes": ("max_grammar_bytes", _bytes, "largest schema, grammar or regex (64KiB)"),
    "--max-grammar-choices": ("max_grammar_choices", _positive, "most guided_choice entries (1024)"),
    "--max-schema-depth": ("max_schema_depth", _positive, "deepest nesting of a JSON schema (32)"),
    "--grammar-timeout": ("grammar_timeout_s", _seconds, "seconds a grammar may compile, then stopped (10)"),
    "--grammar-cache-bytes": ("grammar_cache_bytes", _bytes, "RAM for compiled grammars (256MiB)"),
    "--template-timeout": ("template_timeout_s", _seconds, "seconds a client chat template may take to render (5)"),
    "--header-timeout": ("header_timeout_s", _seconds, "seconds a request's headers may take to arrive (30)"),
    "--body-timeout": ("body_timeout_s", _seconds, "seconds a request's body may take after its headers (120)"),
    "--idle-timeout": ("idle_timeout_s", _seconds, "seconds an idle keep-alive connection stays open (60)"),
    "--max-socket-text": ("max_socket_text", _positive, "most characters in a dashboard chat message (200000)"),
    "--max-media-bytes": ("max_media_bytes", _bytes, "largest image or audio clip named by URL or data: URL (64MiB)"),
    "--max-video-bytes": ("max_video_bytes", _bytes, "largest video clip named by URL or data: URL (256MiB)"),
    "--media-timeout": ("media_timeout_s", _seconds, "seconds one media URL fetch may take, redirects included (10)"),
    "--max-audio-seconds": ("max_audio_seconds", _seconds,
                            "longest audio decoded from one upload, URL, chat part or live session (1800)"),
}


def _add_limit_flags(parser) -> None:
    group = parser.add_argument_group("limits (each also an environment variable; see docs/serving/limits.md)")
    for flag, (name, kind, text) in LIMIT_FLAGS.items():
        group.add_argument(flag, dest=name, type=kind, default=None, help=text)
    group.add_argument("--allow-client-templates", dest="allow_client_templates", action="store_true", default=None,
                       help="let requests bring their own chat template (chat_template_kwargs.chat_template); "
                            "each renders in a separate process with a time budget")
    group.add_argument("--allow-private-media", dest="allow_private_media", action="store_true", default=None,
                       help="fetch image, audio and video URLs from loopback, private and link-local addresses "
                            "too (a NAS, another machine on the LAN); refused by default")


def _limits(opts: dict) -> limits.Limits:
    """The environment's bounds (HEARTH_MAX_BODY_BYTES, …), with the flags over them."""
    given = {name: opts[name] for name, *_ in LIMIT_FLAGS.values() if opts.get(name) is not None}
    for switch in ("allow_client_templates", "allow_private_media"):
        if opts.get(switch):
            given[switch] = True
    return dataclasses.replace(limits.from_env(), **given)


ROUTER_FLAGS = {"--models-dir": "models_dir", "--models-preset": "models_preset", "--models-max": "models_max",
                "--idle-unload": "idle_unload", "--default-model": "default_model",
                "--child-start-timeout": "child_start_timeout", "--child-timeout": "child_timeout",
                "--no-preload": "no_preload", "--models-remote": "models_remote",
                "--models-remote-key": "models_remote_key", "--advertise-url": "advertise_url",
                "--build-demo": "build_demo"}


def _add_router_flags(parser) -> None:
    group = parser.add_argument_group("router mode (`hearth serve` without a MODEL: every model in the library, "
                                      "each loaded in its own process when a request names it)")
    group.add_argument("--models-dir", default=None, metavar="DIR",
                       help="also serve every model folder under DIR (scanned recursively; named by its path "
                            "relative to DIR)")
    group.add_argument("--models-preset", default=None, metavar="FILE",
                       help="per-model settings: an INI file with a [model] section each and [*] for all "
                            "(see docs/serving/router.md, Presets)")
    group.add_argument("--models-max", type=_positive, default=None, metavar="N",
                       help="most models loaded at once; the least recently used idle one is unloaded to load "
                            "another (default: how many of the library's models fit in memory together)")
    group.add_argument("--idle-unload", type=_non_negative(float), default=None, metavar="SECONDS",
                       help="unload a model idle this long (default 0: never; pinned models stay)")
    group.add_argument("--default-model", default=None, metavar="MODEL",
                       help=f"the model for requests that name none (default: {DEMO_REPO} once it is built, "
                            "else none: such requests are refused with the list of models)")
    group.add_argument("--build-demo", action="store_true", default=False,
                       help=f"train the demo chat model {DEMO_REPO} in the background if it is not built yet "
                            "(what `make serve` does): served from its first checkpoint, seconds after the start, "
                            "and swapped for each better one as it trains")
    group.add_argument("--child-start-timeout", type=_seconds, default=None, metavar="SECONDS",
                       help="how long a model's process may take to load (600)")
    group.add_argument("--child-timeout", type=_seconds, default=None, metavar="SECONDS",
                       help="how long the router waits for a model's next byte of a reply (600)")
    group.add_argument("--no-preload", action="store_true", default=False,
                       help="load nothing at start (default: the default model and pinned ones load at once)")
    group.add_argument("--models-remote", action="append", default=None, metavar="URL",
                       help="also serve the models of another machine's `hearth serve` at URL, forwarding "
                            "requests for them there (repeatable; looked at every 5 s: health, models, /fit)")
    group.add_argument("--models-remote-key", default=None, metavar="KEY",
                       help="the API key the remote hosts take (also HEARTH_MODELS_REMOTE_KEY; none by default: "
                            "this server's own key is never sent on)")
    group.add_argument("--advertise-url", default=None, metavar="URL",
                       help="with HEARTH_REDIS_URL: where the other web nodes reach this one to use the models "
                            "it has loaded (also HEARTH_ADVERTISE_URL; default http://HOST:PORT, this machine's "
                            "name when bound to every address)")
    parser.add_argument("--model-id", default=None, help=argparse.SUPPRESS)  # the router's name for its child
    parser.add_argument("--download-only", action="store_true", help=argparse.SUPPRESS)  # the router's fetch


def _set_access(access) -> None:
    runtime.allowed_hosts = access.allowed_hosts
    runtime.api_keys = access.api_keys
    runtime.cors_origins = access.cors_origins
    runtime.insecure_no_auth = access.insecure_no_auth
    runtime.warning = INSECURE_WARNING if access.insecure_no_auth else None


def _report_ready(engine: Engine):
    """Tell the router this child listens on `port`, with its /v1/models row."""
    def ready(port: int) -> None:
        from inference.routes.models import served_row

        child.report("ready", port=port, model=served_row(runtime, engine))
    return ready


def fetch_for_router(ref: str) -> str:
    """A repo the cache lacks, downloaded first (POST /models/load of a
    model not yet in the library), its progress reported to the router."""
    from inference.engine.errors import ModelNotFound
    from inference.engine.loader import resolve

    try:
        resolve(ref)
        return ref
    except ModelNotFound:
        if Path(ref).expanduser().exists() or ref.count("/") != 1:
            raise
    from hub import downloads
    from hub.library import mark_changed

    def progress(p) -> None:
        percent = int(100 * p.received_bytes / p.total_bytes) if p.total_bytes else 0
        child.report("stage", stage="downloading", percent=percent,
                     download={"received_bytes": p.received_bytes, "total_bytes": p.total_bytes,
                               "current_file": p.current_file, "files_done": p.files_done,
                               "files_total": p.files_total})

    child.report("stage", stage="downloading", percent=0, message=f"downloading {ref}")
    try:
        row = downloads.run(downloads.create(ref), report_extra=progress)
    except downloads.DuplicateDownload as exc:
        child.report("error", message=str(exc))
        raise CommandError(str(exc)) from None
    if row.state != "done":
        child.report("error", message=f"downloading {ref} failed: {row.error}")
        raise CommandError(f"downloading {ref} failed: {row.error}")
    mark_changed()
    child.report("stage", stage="loading", percent=0)
    return ref


class Command(BaseCommand):
    help = ("Serve every model in the library on one port (router mode), or one MODEL, over OpenAI, Anthropic and "
            "Responses, with the dashboard and jobs.")

    def add_arguments(self, parser):
        parser.add_argument("model", nargs="?", default=None,
                            help="serve only this model: a local model directory or a repo id in the HF cache "
                                 "(without it: router mode over the library)")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8080)
        parser.add_argument("--max-tokens", type=_non_negative(int), default=None,
                            help="default cap on generated tokens when a request sets none")
        parser.add_argument("--temperature", type=_non_negative(float, checks.MAX_TEMPERATURE), default=None)
        parser.add_argument("--top-p", type=_unit, default=None)
        parser.add_argument("--top-k", type=_non_negative(int), default=None)
        parser.add_argument("--hlg-sampling", type=argtypes.flag(hlg.canonical), default=None, metavar="SPEC",
                            help="HLG tone-curve sampling for every request: key=value pairs joined by commas "
                                 "(enabled, width, shoulder, toe, pivot_offset; e.g. width=3,toe=8), or `on` for "
                                 "the built-in values; a request's `hlg` object is merged over them")
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
        speech = parser.add_argument_group("speech to text (/v1/audio/*, audio parts in chat)")
        speech.add_argument("--whisper-model", default=None, metavar="MODEL",
                            help="an mlx-whisper checkpoint (a repo id in the HF cache or a directory) for "
                                 "transcription; loaded on first use (the demo: hearth/demo-whisper, built by "
                                 "`hearth make-demo-model --kind audio`)")
        speech.add_argument("--whisper-idle-unload", type=_non_negative(float), default=300.0, metavar="SECONDS",
                            help="unload the Whisper model after this many idle seconds (0: keep it loaded; "
                                 "default 300)")
        group = parser.add_argument_group("resumable streams (X-Conversation-Id, the dashboard's chat turns)")
        group.add_argument("--stream-ttl", type=_non_negative(float), default=300.0, metavar="SECONDS",
                           help="how long a stream stays replayable after its generation ended (default 300)")
        group.add_argument("--stream-max-bytes", type=_bytes, default=4 << 20, metavar="SIZE",
                           help="bytes kept per stream; past it the oldest go (default 4MiB)")
        group.add_argument("--streams-max-bytes", type=_bytes, default=256 << 20, metavar="SIZE",
                           help="bytes kept by all streams together, on disk under HEARTH_HOME/streams "
                                "(default 256MiB)")
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
        _add_router_flags(parser)
        group = parser.add_argument_group("throughput and memory")
        group.add_argument("--batch", type=argtypes.flag(argtypes.rows), default=None, metavar="auto|N",
                           help="most rows decoded together by continuous batching: auto (default) grows with "
                                "the requests waiting, up to 64 as memory allows; N caps it; 1 = one at a time")
        group.add_argument("--prefill-chunk", type=_positive, default=256,
                           help="prompt tokens prefilled per step while other rows decode")
        group.add_argument("--max-context", type=_positive, default=None,
                           help="cap on prompt + generated tokens per request; a prompt that fills it is refused")
        group.add_argument("--memory-budget", type=_bytes, default=None,
                           help="bytes for weights + KV caches: sets the context cap from the model and how many "
                                "rows may decode together (default: three quarters of RAM)")
        group.add_argument("--prompt-cache-bytes", type=_bytes, default=1 << 30,
                           help="RAM for reusable prompt KV caches (0 turns the cache off; default 1GiB)")
        group.add_argument("--ssd-cache", default=None, metavar="DIR",
                           help="also keep prompt caches in DIR, found again after a restart")
        group.add_argument("--ssd-cache-bytes", type=_bytes, default=16 << 30,
                           help="disk cap of the SSD tier (oldest entries go first; default 16GiB)")
        group.add_argument("--kv-quant", type=int, choices=(4, 8), default=None,
                           help="quantize the KV cache to 4 or 8 bits (runs on the serial lane)")
        spec = parser.add_argument_group("speculative decoding (a lone request drafts; several batch)")
        spec.add_argument("--draft-model", default=None, metavar="MODEL",
                          help="a small model with the served model's tokenizer drafts tokens for it to check")
        spec.add_argument("--draft-kind", choices=("ngram", "model"), default=None,
                          help="ngram: prompt lookup, drafts copied from the context (no model); "
                               "model: --draft-model (implied by it)")
        spec.add_argument("--draft-tokens", type=_positive, default=None,
                          help="most drafted tokens per step (default 8 for ngram, 3 for a draft model)")

    def handle(self, *args, **opts):
        bounds = self.settle(opts)
        router = self.preflight(opts)
        if router is not None:
            from config.serve_router import serve_router

            serve_router(router, opts)
            return
        in_router = child.is_child()
        log.info("BLAS: %s", blas_in_use())
        if not in_router:  # the router migrated the database before it started this process
            call_command("migrate", interactive=False, verbosity=0)
        if in_router and opts["download_only"]:
            fetch_for_router(opts["model"])
            return
        engine = self.load(opts, bounds)
        loaded = engine.loaded
        assert loaded is not None  # started
        child.report("stage", stage="starting server", percent=90)
        from hub.locks import record_serving

        marker = record_serving(loaded.path)  # GC in any process keeps this snapshot
        supervisor = None if in_router else start_services(opts["no_worker"])
        try:
            run_daphne(EngineWork(engine, opts["flush_seconds"]), opts["host"], opts["port"], opts["drain_seconds"],
                       loaded.model_id, on_listen=_report_ready(engine) if in_router else None)
        finally:
            marker.unlink(missing_ok=True)
            stop_services(supervisor)
        log.info("stopped")
        exit_now()

    def settle(self, opts: dict) -> limits.Limits:
        """What serving settles first, in either mode: who may call, the bounds
        on a request (this process's and its children's), and the runtime's
        options. Answers the bounds; CommandError when a flag is refused."""
        try:
            access = settle(opts["host"], opts["api_key"], opts["api_key_file"], opts["cors_origin"],
                            opts["insecure_no_auth"], os.environ, settings.HEARTH_BEHIND_PROXY)
            export_for_children(access, opts["allow_path"], opts["api_key_file"])
        except AccessError as exc:
            raise CommandError(str(exc)) from None
        if access.insecure_no_auth:
            log.warning("WARNING: %s", INSECURE_WARNING)
        try:
            bounds = _limits(opts)
        except limits.LimitError as exc:
            raise CommandError(str(exc)) from None
        limits.export(bounds)  # this process, the worker and every child see the same bounds
        _set_access(access)
        runtime.started_at = int(time.time())
        if opts["streams_max_bytes"] < opts["stream_max_bytes"]:
            raise CommandError(f"--streams-max-bytes ({opts['streams_max_bytes']}) is less than one stream's "
                               f"--stream-max-bytes ({opts['stream_max_bytes']}): no resumable stream would fit")
        runtime.options = self._options(opts, bounds)
        if child.is_child():  # the router's key: it states the holder of each request it passes on
            runtime.hop_keys = access.api_keys - {access.internal_key}  # (config/access.py)
        return bounds

    def preflight(self, opts: dict):
        """The checks of the mode's own flags, after `settle`. In router mode
        (no MODEL) answers the router's plan (`config.serve_router.plan_router`),
        else None. CommandError when a flag cannot work."""
        in_router = child.is_child()
        if opts["model"] is None and not in_router:
            from config.serve_router import plan_router

            if opts["draft_model"]:
                raise CommandError("--draft-model belongs to one model: in router mode set draft-model in that "
                                   "model's section of --models-preset (--draft-kind ngram applies to all)")
            return plan_router(opts)
        router_only = [flag for flag, key in ROUTER_FLAGS.items() if opts.get(key) not in (None, False)]
        if router_only and not in_router:
            raise CommandError(f"{router_only[0]} is for router mode: run `hearth serve` without a MODEL")
        return None

    def load(self, opts: dict, bounds: limits.Limits) -> Engine:
        """Load the model (`opts["model"]`) and fill the runtime with it: the
        engine, Whisper beside it, the resumable streams, embeddings and the
        grammar bounds. Answers the started engine."""
        child.report("stage", stage="loading", percent=5)
        engine = Engine(opts["model"], engine_config(opts))
        try:
            loaded = engine.start()
        except EngineError as exc:
            child.report("error", message=str(exc))
            raise CommandError(str(exc)) from None
        if opts["model_id"]:
            loaded.model_id = opts["model_id"]
        if opts["adapter"]:
            self._mount_default(engine, opts["adapter"])
        runtime.engine = engine
        runtime.transcriber = Transcriber(opts["whisper_model"], engine.exclusive, opts["whisper_idle_unload"])
        open_streams(opts, record=not child.is_child())
        runtime.embeddings_enabled = opts["embeddings"] or loaded.is_embedding_model
        loaded.grammar_compiler.cache_bytes = bounds.grammar_cache_bytes
        loaded.grammar_compiler.timeout_s = bounds.grammar_timeout_s
        log.info("model %s ready (%s, context %s)", loaded.model_id, loaded.dtype, loaded.context_window)
        return engine

    def _options(self, opts: dict, bounds: limits.Limits) -> Options:
        templates = None
        if bounds.allow_client_templates:
            from inference.protocols.template_sandbox import TemplateSandbox

            templates = TemplateSandbox(timeout_s=bounds.template_timeout_s)
            log.warning("client chat templates are allowed: each renders in its own process, at most %gs",
                        bounds.template_timeout_s)
        if settings.HEARTH_REDIS_URL:  # every web node on this Redis continues every stored turn
            runtime.responses = RedisResponseStore(settings.HEARTH_REDIS_URL, ttl_s=opts["response_ttl"])
        else:
            runtime.responses = ResponseStore(ttl_s=opts["response_ttl"])
        return Options(
            defaults=ServerDefaults(opts["max_tokens"] or None, opts["temperature"], opts["top_p"], opts["top_k"],
                                    hlg.parse_spec(opts["hlg_sampling"]) if opts["hlg_sampling"] else None),
            limits=bounds, grammar_enabled=settings.HEARTH_GRAMMAR, templates=templates,
            sse_keepalive=settings.HEARTH_SSE_KEEPALIVE)

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


