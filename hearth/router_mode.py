"""`hearth serve` without a MODEL: the router. Every model in the library on
one port, each loaded into a process of its own (a `hearth serve MODEL`
on a private loopback port) when a request names it; the default model
and pinned ones load at start.

Flags every model shares (batching, context, sampling defaults, …; those
marked `shared` in `serving/serve_flags.py`) are handed to each child,
the preset's per-model flags after them; the memory
budget (`--memory-budget`, else three quarters of RAM) is the total, and
each child gets an equal share of it among the models loaded at once; the request
bounds reach the children through the environment (`core.limits.export`).
Each child keeps its prompt cache's SSD tier under HEARTH_HOME/prompt-cache
(or `--ssd-cache`), one folder per model, so a model unloaded to make
room starts warm when it is loaded again. The children store Responses
turns in one folder of the router's (HEARTH_HOME/responses/router-PID,
removed when the router stops; Redis instead where HEARTH_REDIS_URL is set),
so a turn continues on any model and outlives the process that stored it.

`hearth serve MODEL --isolate` is this router over MODEL alone
(`plan_isolated`): its process starts with the server and starts again
whenever it exits unasked, so an engine crash never takes the web server,
its streams, its dashboard or its stored turns with it.
"""
from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.core.management import call_command
from django.core.management.base import CommandError

from core import device, home
from hearth.access_settings import is_loopback
from hearth.demo_training import DemoTraining, demo_checkpoint_step, demo_is_built, speech_is_built
from hearth.process import Work, exit_now, open_streams, run_daphne, start_services, stop_services
from hearth.root import RUNTIME as runtime
from hub import fit
from hub.registry import whisper_checkpoints
from inference.protocols.response_store import FolderResponseStore
from serving import serve_flags
from serving.demo.build import DEMO_REPO
from serving.demo.whisper_build import WHISPER_REPO
from serving.router import remotes
from serving.router.catalog import Catalog, CatalogError, Library, OneModel
from serving.router.manager import Manager
from serving.router.owners import Owners
from serving.router.presets import Preset, PresetError
from serving.router.remotes import RemoteHost
from serving.router.slots import RouterError, Settings
from serving.streams.disk import Owner

log = logging.getLogger("hearth.serve")

MOST_BY_DEFAULT = 8
STOP_GRACE_S = 10.0  # at shutdown, how long a model's process may take to exit once its prompt cache is written


class RouterWork(Work):
    """At shutdown, after the drain: every model's process is told to stop
    (it finishes what it still runs, within its own --drain-seconds, then
    writes its prompt cache to the SSD tier, within --flush-seconds); those
    still running `STOP_GRACE_S` past that are killed."""

    def __init__(self, manager: Manager, drain_s: float, flush_s: float):
        self.manager, self.close_s = manager, drain_s + flush_s + STOP_GRACE_S

    def busy(self) -> bool:
        return any(s.users for s in self.manager.slots.values())

    def closing(self) -> str:
        return (f"; then the models' processes finish, write their prompt caches and exit, at most "
                f"{self.close_s:.0f}s "
                "(one still running then is killed)")

    def close(self, flush: bool) -> None:
        self.manager.stop_all(self.close_s if flush else 5.0)

    def draining(self) -> None:
        self.manager.leave()  # the other web nodes load what this one served, rather than pass it here


def child_args(opts: dict) -> list[str]:
    """The router's own values of the flags every model's process shares
    (`serving.serve_flags`, those marked `shared`), as that process's flags."""
    args = []
    for flag in serve_flags.SHARED:
        value = opts.get(flag.target)
        if flag.switch:
            args += [flag.name] if value else []
        elif value is not None:
            args += [flag.name, str(value)]
    return args


def default_models_max(catalog: Catalog, usable: int) -> int:
    """How many of the library's models fit in memory together, smallest
    first (what /fit says of each), at least 1 and at most 8."""
    sizes = sorted(b for b in (e.estimated_bytes(usable) for e in catalog.entries.values()) if b)
    count, total = 0, 0
    for size in sizes:
        if total + size > usable:
            break
        count, total = count + 1, total + size
    return max(1, min(MOST_BY_DEFAULT, count))


def remote_hosts(opts: dict) -> list[RemoteHost]:
    """`--models-remote` hosts, looked at once before the router starts (so
    `--default-model` may name one of their models)."""
    urls = opts.get("models_remote") or []
    if not urls:
        return []
    try:
        checked = list(dict.fromkeys(remotes.checked_url(url) for url in urls))
    except remotes.RemoteUrlError as exc:
        raise CommandError(str(exc)) from None
    # Never this server's own key by default: that is what its clients hold, and it must not travel on.
    key = opts.get("models_remote_key") or os.environ.get("HEARTH_MODELS_REMOTE_KEY", "").strip() or None
    hosts = [RemoteHost(url, key) for url in checked]
    remotes.probe_all(hosts)
    return hosts


def advertised_url(opts: dict) -> str:
    """Where the other web nodes reach this one: --advertise-url or
    HEARTH_ADVERTISE_URL, else the bound address and port (this machine's
    name when bound to every address)."""
    given = opts.get("advertise_url") or os.environ.get("HEARTH_ADVERTISE_URL", "").strip()
    if given:
        try:
            return remotes.checked_url(given, "--advertise-url")
        except remotes.RemoteUrlError as exc:
            raise CommandError(str(exc)) from None
    host = opts["host"]
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"http://{f'[{host}]' if ':' in host else host}:{opts['port']}"


def share_ownership(manager: Manager, opts: dict) -> None:
    """With Redis: which node serves each model is shared with the other web
    nodes (serving/router/owners.py), and their hop key is accepted here."""
    from django.conf import settings

    if not settings.HEARTH_REDIS_URL:
        return
    node = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    owners = Owners(settings.HEARTH_REDIS_URL, node, advertised_url(opts))

    def accept(key: str) -> None:
        if runtime.api_keys:  # with no key configured every request passes already
            runtime.api_keys = runtime.api_keys | {key}
        runtime.hop_keys = runtime.hop_keys | {key}  # another node states the holder of what it passes on

    advertised = urlsplit(owners.advertise)
    if advertised.port == 0 or (is_loopback(advertised.hostname or "") and not is_loopback(opts["host"])):
        log.warning("router: the other web nodes would reach this one at %s; give its address with "
                    "--advertise-url", owners.advertise)
    # Its own name, as the others send it in Host (None admits every name already).
    if advertised.hostname and runtime.allowed_hosts is not None:
        runtime.allowed_hosts = runtime.allowed_hosts | {advertised.hostname.lower()}
    key = owners.read_hop_key()
    if key:
        accept(key)
    manager.cluster.owners, manager.cluster.on_hop_key = owners, accept
    log.info("router: models shared with the other web nodes on Redis as %s (%s)", node, owners.advertise)


def default_model(opts: dict) -> str | None:
    """The model a request that names none gets: --default-model, else the
    demo chat model once it is built, else none (nothing is trained unasked)."""
    if opts["default_model"]:
        return opts["default_model"]
    return DEMO_REPO if demo_is_built() else None


@dataclass
class RouterPlan:
    """What a router serves, settled before it starts anything."""
    manager: Manager
    settings: Settings
    training: bool  # the demo model trains in the background (`--build-demo`, not built yet)
    speech: bool = False  # and the demo speech model after it (`--build-demo`, no Whisper in the library)
    responses: Path | None = None  # the folder its children store Responses turns in (None: Redis)


_owners: list[Owner] = []  # this process's claims on its folders (the kernel lets go at any exit)


def responses_folder() -> Path | None:
    """A folder of its own for this router's stored Responses turns (None
    with Redis, which every web node shares), claimed with the streams'
    owner lock while the router lives (`serving.streams.disk.Owner`: a
    lock, not a pid, since pids are reused and containers share
    HEARTH_HOME); the folders of routers that did not stop cleanly (a
    SIGKILL: their lock is free) are removed."""
    from django.conf import settings

    if settings.HEARTH_REDIS_URL:
        return None
    root = home.root() / "responses"
    for old in root.glob("router-*"):
        if Owner.gone(root, old.name.removeprefix("router-")):
            shutil.rmtree(old, ignore_errors=True)
            (root / "owners" / f"{old.name.removeprefix('router-')}.lock").unlink(missing_ok=True)
    owner = Owner(root)  # claimed before its folder exists: a folder is never seen unclaimed
    _owners.append(owner)
    folder = root / f"router-{owner.name}"
    folder.mkdir(mode=0o700)
    return folder


def _store_args(folder: Path | None) -> tuple[str, ...]:
    return ("--response-store", str(folder)) if folder is not None else ()


def plan_router(opts: dict) -> RouterPlan:
    """Check router mode's flags and read the library: CommandError names
    the first that cannot work (a bad preset line, an unknown default)."""
    if opts["adapter"]:
        raise CommandError("--adapter names one model's adapter: in router mode, set `adapter = DIR` in that "
                           "model's section of --models-preset")
    log.info("Device: %s", device.planned_line())
    call_command("migrate", interactive=False, verbosity=0)
    folder = responses_folder()
    default = default_model(opts)
    training = opts["build_demo"] and not demo_is_built()
    if training and default is None and demo_checkpoint_step() is not None:
        default = DEMO_REPO  # a build cut short left a checkpoint: served until the new build passes it
    speech = bool(opts["build_demo"]) and opts["whisper_model"] in (None, WHISPER_REPO) and not speech_is_built()
    if speech and opts["whisper_model"] == WHISPER_REPO and WHISPER_REPO not in whisper_checkpoints():
        opts["whisper_model"] = None  # named, but no build of it yet: the models get it once it is built
    usable = fit.usable_bytes()
    try:
        library = Library(Path(opts["models_dir"]) if opts["models_dir"] else None,
                          Path(opts["models_preset"]) if opts["models_preset"] else None,
                          extra=(default,) if default else ())
        catalog = library.scan(strict=True)
        settings = Settings(
            models_max=opts["models_max"] or default_models_max(catalog, usable),
            idle_unload_s=opts["idle_unload"] or 0.0,
            start_timeout_s=opts["child_start_timeout"] or 600.0,
            request_timeout_s=opts["child_timeout"] or 600.0,
            stop_timeout_s=opts["drain_seconds"] + opts["flush_seconds"] + 15.0,
            child_args=(*child_args(opts), *_store_args(folder)),
            cache_root=opts["ssd_cache"] or str(home.prompt_caches()),
            memory_total=opts["memory_budget"] or usable, drain_s=opts["drain_seconds"],
            flush_s=opts["flush_seconds"])
        hosts = remote_hosts(opts)
        manager = Manager(library, settings, default, usable, catalog, hosts)
    except (CatalogError, PresetError) as exc:
        raise CommandError(str(exc)) from None
    except RouterError as exc:
        raise CommandError(f"--default-model: {exc.message}") from None
    return RouterPlan(manager, settings, training, speech=speech, responses=folder)


# What `--isolate` hands the model's process besides the shared flags: the flags about one model, as
# a preset section would (--memory-budget is the router's total, and one model's share is all of it).
ISOLATED_OWN = ("adapter", "kv_budget", "ssd_cache", "draft_model")
ISOLATE_TOO = ("child_start_timeout", "child_timeout")  # router flags that mean the same for one process


def plan_isolated(opts: dict) -> RouterPlan:
    """`hearth serve MODEL --isolate`: the router over MODEL alone, pinned,
    its process started again whenever it exits unasked. CommandError names
    a flag that cannot work so, or a MODEL that is not there."""
    from inference.engine.errors import ModelNotFound
    from inference.engine.loader import resolve

    router_only = [f.name for f in serve_flags.ROUTER_ONLY
                   if f.target not in ISOLATE_TOO and opts.get(f.target) not in (None, False)]
    if router_only:
        raise CommandError(f"{router_only[0]} is for router mode (`hearth serve` without a MODEL); --isolate "
                           "serves one model")
    try:
        model_id, path = resolve(opts["model"])
    except ModelNotFound as exc:
        raise CommandError(str(exc)) from None
    model_id = opts["model_id"] or model_id
    flags = {}
    for target in ISOLATED_OWN:
        flag = next(f for f in serve_flags.FLAGS if f.target == target)
        value = opts.get(target)
        if value is not None and value != flag.default:
            flags[flag.key] = str(Path(value).expanduser().resolve()) if flag.path else value
    log.info("Device: %s", device.planned_line())
    call_command("migrate", interactive=False, verbosity=0)
    folder = responses_folder()
    preset = Preset(name=model_id, source="", flags=flags, aliases=tuple(opts["aliases"] or ()),
                    tags=tuple(opts["tags"] or ()), pinned=True)
    settings = Settings(
        models_max=1, start_timeout_s=opts["child_start_timeout"] or 600.0,
        request_timeout_s=opts["child_timeout"] or 600.0,
        stop_timeout_s=opts["drain_seconds"] + opts["flush_seconds"] + 15.0,
        child_args=(*child_args(opts), *_store_args(folder)),
        cache_root=None if opts["ssd_cache"] else str(home.prompt_caches()),
        memory_total=opts["memory_budget"] or fit.usable_bytes(), isolated=True, drain_s=opts["drain_seconds"],
        flush_s=opts["flush_seconds"])
    try:
        manager = Manager(OneModel(model_id, path, preset), settings, model_id, fit.usable_bytes())
    except CatalogError as exc:
        raise CommandError(str(exc)) from None
    return RouterPlan(manager, settings, False, responses=folder)


def serve_router(plan: RouterPlan, opts: dict) -> None:
    manager, settings, training = plan.manager, plan.settings, plan.training
    share_ownership(manager, opts)
    runtime.router = manager
    runtime.whisper_model = opts["whisper_model"]  # its models' processes have it (a shared flag)
    if plan.responses is not None:  # what the children store, seen here too (/stats, GET /engine)
        runtime.responses = FolderResponseStore(plan.responses, ttl_s=opts["response_ttl"])
    open_streams(opts)
    pinned = [s.id for s in manager.slots.values() if s.pinned]
    preload = [] if opts["no_preload"] else [m for m in dict.fromkeys([manager.default, *pinned]) if m]
    log.info("router: %d models in the library, at most %d loaded at once, default %s",
             len(manager.slots), settings.models_max, manager.default or "none (requests must name a model)")
    demo = DemoTraining(manager, chat=training, speech=plan.speech) if training or plan.speech else None
    if demo is not None:
        demo.start()
    supervisor = start_services(opts["no_worker"])

    def on_start() -> None:
        manager.start(preload)
        if demo is not None:
            demo.watch()
    try:
        status = run_daphne(RouterWork(manager, opts["drain_seconds"], settings.flush_s), opts["host"], opts["port"],
                            opts["drain_seconds"],
                            f"the router ({len(manager.slots)} models, default {manager.default or 'none'})",
                            on_start=on_start)
    finally:
        if demo is not None:
            demo.stop()
        stop_services(supervisor)
        if plan.responses is not None:  # the stored turns end with the router
            shutil.rmtree(plan.responses, ignore_errors=True)
            for owner in _owners:
                owner.close()
    log.info("stopped")
    exit_now(status)
