"""`hearth serve [MODEL]`: load one model and serve it with daphne. The
composition root: it fills the runtime (hearth/root.py) and starts the
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
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from core import argtypes, device, limits
from hearth.access_settings import INSECURE_WARNING, AccessError, export_for_children, settle
from hearth.process import (
    EngineWork,
    ListenError,
    check_port,
    engine_config,
    exit_now,
    open_streams,
    run_daphne,
    start_services,
    stop_services,
)
from hearth.root import RUNTIME as runtime
from inference.engine import hlg
from inference.engine.engine import Engine
from inference.engine.errors import EngineError
from inference.engine.speech import Transcriber
from inference.protocols.options import Options, ServerDefaults
from inference.protocols.response_store import FolderResponseStore, RedisResponseStore, ResponseStore
from serving import serve_flags
from serving.router import child

log = logging.getLogger("hearth.serve")


def _add_flags(parser) -> None:
    """Every flag, from its one declaration (`serving.serve_flags`), each in its --help section."""
    sections = {"": parser}
    for flag in serve_flags.FLAGS:
        if flag.group not in sections:
            sections[flag.group] = parser.add_argument_group(flag.group)
        kwargs: dict[str, Any] = {"dest": flag.target, "default": flag.default,
                                  "help": argparse.SUPPRESS if flag.hidden else flag.help}
        if flag.switch:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(metavar=flag.metavar, action="append" if flag.repeat else "store")
            if flag.parse is not None:
                kwargs["type"] = argtypes.flag(flag.parse)
        sections[flag.group].add_argument(*flag.names, **kwargs)


def _limits(opts: dict) -> limits.Limits:
    """The environment's bounds (HEARTH_MAX_BODY_BYTES, …), with the flags over them."""
    given = {f.target: opts[f.target] for f in serve_flags.LIMIT_FLAGS if opts.get(f.target) is not None}
    return dataclasses.replace(limits.from_env(), **given)


def _set_access(access) -> None:
    runtime.allowed_hosts = access.allowed_hosts
    runtime.api_keys = access.api_keys
    runtime.cors_origins = access.cors_origins
    runtime.insecure_no_auth = access.insecure_no_auth
    runtime.warning = INSECURE_WARNING if access.insecure_no_auth else None


def _report_ready(engine: Engine):
    """Tell the router this child listens on `port`, with its /v1/models row."""
    def ready(port: int) -> None:
        from serving.routes.listing import served_row

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
        raise CommandError(f"downloading {ref} failed: {row.error}" + (f" ({row.detail})" if row.detail else ""))
    mark_changed()
    child.report("stage", stage="loading", percent=0)
    return ref


def first_whisper() -> str | None:
    """The Whisper model transcription uses when --whisper-model names none:
    the first mlx-whisper checkpoint in the library by repo id, the demo's
    (trained on spoken digits only) last; None when there is none."""
    from hub.registry import whisper_checkpoints
    from serving.demo.whisper_build import WHISPER_REPO

    found = sorted(whisper_checkpoints(), key=lambda repo: (repo == WHISPER_REPO, repo))
    if found:
        log.info("transcription: %s, the first Whisper in the library (--whisper-model picks another)", found[0])
    return found[0] if found else None


class Command(BaseCommand):
    help = ("Serve every model in the library on one port (router mode), or one MODEL, over OpenAI, Anthropic and "
            "Responses, with the dashboard and jobs.")

    def add_arguments(self, parser):
        parser.add_argument("model", nargs="?", default=None,
                            help="serve only this model: a local model directory or a repo id in the HF cache "
                                 "(without it: router mode over the library)")
        _add_flags(parser)

    def handle(self, *args, **opts):
        bounds = self.settle(opts)
        try:
            check_port(opts["host"], opts["port"])
        except ListenError as exc:
            raise CommandError(str(exc)) from None
        router = self.preflight(opts)
        if router is not None:
            from hearth.router_mode import serve_router

            serve_router(router, opts)
            return
        in_router = child.is_child()
        # The router said it once for every model's process (`plan_router`): a user reads one line per serve
        log.log(logging.DEBUG if in_router else logging.INFO, "Device: %s", device.line())
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
            status = run_daphne(EngineWork(engine, opts["flush_seconds"]), opts["host"], opts["port"],
                                opts["drain_seconds"], loaded.model_id,
                                on_listen=_report_ready(engine) if in_router else None)
        finally:
            marker.unlink(missing_ok=True)
            stop_services(supervisor)
        log.info("stopped")
        exit_now(status)

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
        if opts["whisper_model"] is None and not child.is_child():  # a router hands its own choice to its models
            opts["whisper_model"] = first_whisper()
        if child.is_child():  # the router's key: it states the holder of each request it passes on
            runtime.hop_keys = access.api_keys - {access.internal_key}  # (hearth/access.py)
        return bounds

    def preflight(self, opts: dict):
        """The checks of the mode's own flags, after `settle`. In router mode
        (no MODEL) answers the router's plan (`hearth.router_mode.plan_router`),
        else None. CommandError when a flag cannot work."""
        in_router = child.is_child()
        if opts["isolate"] and not in_router:
            if opts["model"] is None:
                raise CommandError("--isolate serves one MODEL from a process of its own; router mode (`hearth "
                                   "serve` without a MODEL) already serves each model so")
            from hearth.router_mode import plan_isolated

            return plan_isolated(opts)
        if opts["model"] is None and not in_router:
            from hearth.router_mode import plan_router

            if opts["draft_model"]:
                raise CommandError("--draft-model belongs to one model: in router mode set draft-model in that "
                                   "model's section of --models-preset (--draft-kind ngram applies to all)")
            for flag, key in (("--alias", "aliases"), ("--tags", "tags"), ("--kv-budget", "kv_budget")):
                if opts[key]:  # one model's setting: a preset key in router mode
                    raise CommandError(f"{flag} is about one served model: in router mode set `{flag[2:]}` in "
                                       "that model's section of --models-preset")
            return plan_router(opts)
        router_only = [f.name for f in serve_flags.ROUTER_ONLY if opts.get(f.target) not in (None, False)]
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
        runtime.aliases, runtime.tags = opts["aliases"] or (), opts["tags"] or ()
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
        elif opts["response_store"]:  # a router's: its model processes share the folder
            runtime.responses = FolderResponseStore(opts["response_store"], ttl_s=opts["response_ttl"])
        else:
            runtime.responses = ResponseStore(ttl_s=opts["response_ttl"])
        return Options(
            defaults=ServerDefaults(opts["max_tokens"] or None, opts["temperature"], opts["top_p"], opts["top_k"],
                                    hlg.parse_spec(opts["hlg_sampling"]) if opts["hlg_sampling"] else None,
                                    {"on": True, "off": False}.get(opts["thinking"])),
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


