from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from core import torchless
from core.blas import find_openblas as _find_openblas

torchless.install()  # as every hearth process does (core/torchless.py)

# Every test, and every server it starts, works in throwaway homes.
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="hearth-tests-"))
os.environ["HEARTH_HOME"] = str(_SESSION_DIR / "hearth")
os.environ["HF_HOME"] = str(_SESSION_DIR / "hf")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("HF_HUB_CACHE", None)
# SQLite in those homes, whatever database the machine running the tests is set up for
# (tests/e2e/test_postgres.py sets DATABASE_URL for the servers it starts).
os.environ.pop("DATABASE_URL", None)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Tests keep their fixture files in pytest's temporary folders; servers may
# read them because the run allows that folder, as `--allow-path` would.
_TMP_DIR = _SESSION_DIR / "tmp"
os.environ["HEARTH_ALLOW_PATHS"] = str(_TMP_DIR)
# Servers run on OpenBLAS, named, so a fresh home does not measure the BLAS
# libraries at every start; tests/core/test_blas.py measures.
os.environ.setdefault("HEARTH_BLAS", "openblas" if _find_openblas() else "reference")
# One reading of the machine's bandwidths for every home of the run, taken once by the main
# process before the tests start (pytest_configure; the xdist workers inherit the variable), so no
# server start probes again (~3 CPU-seconds each).
if "PYTEST_XDIST_WORKER" not in os.environ:  # the main process; its xdist workers inherit its file
    os.environ["HEARTH_MACHINE_FILE"] = str(_SESSION_DIR / "machine.json")

from tests.helpers import TINY_REPO, ServerProcess, build_tiny_model, server_env  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # Before the tmp_path factory reads it: every tmp_path lies in the allowed folder.
    if config.option.basetemp:
        os.environ["HEARTH_ALLOW_PATHS"] = str(Path(config.option.basetemp).resolve())
    else:
        config.option.basetemp = str(_TMP_DIR)
    if getattr(config, "workerinput", None) is None:  # the main process, before any worker or server starts
        _measure_machine()


def _measure_machine() -> None:
    """The run's one reading of the machine (HEARTH_MACHINE_FILE), taken as a
    server would take it: in a process with the servers' BLAS preloaded (the
    BLAS is part of the reading's key)."""
    import subprocess
    import sys

    from core import blas

    choice = blas.choose(os.environ["HEARTH_BLAS"], "env", Path(os.environ["HEARTH_HOME"]) / "blas.json")
    code = "import sys; from pathlib import Path; from hub import fit; fit.machine(Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, os.environ["HEARTH_MACHINE_FILE"]], check=True, timeout=300,
                   env=blas.launch_env(choice, dict(os.environ)), cwd=Path(__file__).parent.parent)


def pytest_sessionfinish(session, exitstatus):
    # Servers and models live under one temporary folder; nothing outlives the run
    # (a demo build still running because the run stopped early goes too).
    for build in (_demo, _vision):
        proc = build.get("proc")
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def homes() -> tuple[Path, Path]:
    return Path(os.environ["HF_HOME"]), Path(os.environ["HEARTH_HOME"])


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real Debian `redis-server` on a free loopback port, nothing saved to
    disk, for the whole session (`make test` installs it); its URL."""
    import subprocess
    import time

    import redis

    from tests.helpers import free_port

    port, folder = free_port(), tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)],
                            stdout=open(folder / "redis.log", "wb"), stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert proc.poll() is None, (folder / "redis.log").read_text()
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.05)
    try:
        yield url
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="session")
def tiny_model(homes) -> str:
    hf_home, _ = homes
    build_tiny_model(hf_home / "hub")
    return TINY_REPO


@pytest.fixture(scope="session")
def server(homes, tiny_model, tmp_path_factory):
    """One real `hearth serve` on the tiny random model for the whole session."""
    env = dict(server_env(*homes), HEARTH_SSE_KEEPALIVE="0.001")  # keep-alives show up in tests
    proc = ServerProcess(env, tiny_model, log_path=tmp_path_factory.mktemp("logs") / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        code = proc.stop()
        assert code == 0, f"server exited {code} on SIGTERM:\n{proc.output()}"


# The demo model takes minutes to train. A run whose tests need it starts the
# build as soon as the tests are collected, niced, in its own homes, so it
# trains on whatever CPU the earlier tests leave idle; `demo_build` waits for it.
_DEMO_HOMES = (_SESSION_DIR / "demo" / "hf", _SESSION_DIR / "demo" / "hearth")
_demo: dict = {}


# The demo vision model (tests/demo/test_vision.py) is built the same way, in homes of its own.
_VISION_HOMES = (_SESSION_DIR / "vision" / "hf", _SESSION_DIR / "vision" / "hearth")
_vision: dict = {}

# And the demo speech model (tests/demo/test_speech.py).
_SPEECH_HOMES = (_SESSION_DIR / "speech" / "hf", _SESSION_DIR / "speech" / "hearth")
_speech: dict = {}


def _start_build(build: dict, name: str, homes: tuple[Path, Path], *args: str) -> None:
    import subprocess

    from tests.helpers import HEARTH, ROOT

    out = _SESSION_DIR / f"{name}-build.log"
    build["log"] = out
    with open(out, "wb") as log:
        build["proc"] = subprocess.Popen(["nice", "-n", "10", *HEARTH, "make-demo-model", *args], cwd=ROOT,
                                         env=server_env(*homes), stdout=log, stderr=subprocess.STDOUT)


def _start_demo_build() -> None:
    _start_build(_demo, "demo", _DEMO_HOMES)


def _start_vision_build() -> None:
    _start_build(_vision, "vision", _VISION_HOMES, "--kind", "vision")


def _start_speech_build() -> None:
    _start_build(_speech, "speech", _SPEECH_HOMES, "--kind", "audio")


def _builds(item) -> set[str]:
    """The background builds (`demo_build`, `vision_build`, `speech_build`) a collected test waits for."""
    return {"demo_build", "vision_build", "speech_build"} & set(getattr(item, "fixturenames", ()))


HEAVY_FIRST = {name: rank for rank, name in enumerate(
    ("e2e", "router", "browser", "hub", "jobs", "api", "chat", "engine", "protocols", "core", "memory"))}


def pytest_collection_modifyitems(session, config, items):
    """Test files that need a demo model built run last, in their usual
    order, so the build trains beside every other test instead of leaving
    the run waiting on it halfway (about ten minutes on a 2-core machine)."""
    late = {item.path for item in items if _builds(item)}
    items[:] = [item for item in items if item.path not in late] + [item for item in items if item.path in late]
    if getattr(config, "workerinput", None) is not None or config.getoption("numprocesses", None):
        # In parallel (pytest-xdist hands out whole files, in this order): the folders whose files take
        # longest go first, so no worker is left with a long file at the end while the other idles.
        items.sort(key=lambda item: HEAVY_FIRST.get(item.path.parent.name, len(HEAVY_FIRST)))


def pytest_collection_finish(session):
    used = set().union(*(_builds(item) for item in session.items))
    if "demo_build" in used:
        _start_demo_build()
    if "vision_build" in used:
        _start_vision_build()
    if "speech_build" in used:
        _start_speech_build()


@pytest.fixture(scope="session")
def demo_homes():
    return _DEMO_HOMES


@pytest.fixture(scope="session")
def demo_build(demo_homes):
    """`hearth make-demo-model` once per run (started in the background at
    collection); the demo tests and the memory synthesis tests share the model
    it builds. Answers the build's output."""
    return _finished(_demo, _start_demo_build, 2400)


def _finished(build: dict, start, timeout: int) -> str:
    """A background build's output once it has ended well (started now if
    the tests were collected some other way)."""
    if "proc" not in build:
        start()
    code = build["proc"].wait(timeout=timeout)
    output = build["log"].read_text(errors="replace")
    assert code == 0, output
    return output


@pytest.fixture(scope="session")
def vision_homes():
    return _VISION_HOMES


@pytest.fixture(scope="session")
def vision_build(vision_homes):
    """`hearth make-demo-model --kind vision` once per run (started in the
    background at collection). Answers the build's output."""
    return _finished(_vision, _start_vision_build, 1200)


@pytest.fixture(scope="session")
def speech_homes():
    return _SPEECH_HOMES


@pytest.fixture(scope="session")
def speech_build(speech_homes):
    """`hearth make-demo-model --kind audio` once per run (started in the
    background at collection). Answers the build's output."""
    return _finished(_speech, _start_speech_build, 3600)  # beside the chat and vision builds on 2 cores


@pytest.fixture(scope="module")
def engines(tiny_model):
    """Engines on the tiny model in this process, one per configuration
    (`engines(batch=1, ...)`), kept for the module and closed after it."""
    from inference.engine.engine import Engine, EngineConfig

    made: dict = {}

    def get(**kw) -> Engine:
        key = tuple(sorted(kw.items()))
        if key not in made:
            made[key] = Engine(tiny_model, EngineConfig(**kw))
            made[key].start()
        return made[key]

    yield get
    for engine in made.values():
        engine.close(drain_seconds=1)


@pytest.fixture(scope="module")
def local_engine(tiny_model):
    """An engine on the tiny model in this process, handed to the runtime as
    `hearth serve` would hand it, for one module (the previous one is put back)."""
    import django

    django.setup()
    from hearth.root import RUNTIME
    from inference.engine.engine import Engine

    engine = Engine(tiny_model)
    engine.start()
    before, RUNTIME.engine = RUNTIME.engine, engine
    try:
        yield engine
    finally:
        RUNTIME.engine = before
        engine.close(drain_seconds=0)


@pytest.fixture(scope="module")
def inproc(local_engine):
    """The serving stack in this process (`tests.inproc.InProcess`) on `local_engine`."""
    from hearth.asgi import application
    from tests.inproc import InProcess

    return InProcess(application)


@pytest.fixture(scope="module")
def served(tiny_model):
    """`served(*flags)`: `hearth serve TINY FLAGS` in this process
    (`tests.inproc.serving`), as an `InProcess`, kept while the module asks
    for the same flags. One at a time: asking for others closes it first."""
    import contextlib

    from tests.inproc import serving

    stack = contextlib.ExitStack()
    current: dict = {}

    def start(*flags: str, model: str = tiny_model):
        key = (model, *flags)
        if current.get("key") != key:
            current.clear()
            stack.close()
            current.update(key=key, app=stack.enter_context(serving(model, *flags)))
        return current["app"]

    with stack:
        yield start


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server (Debian's, tests/pg.py) for the session, started at first use."""
    from tests.pg import Postgres

    server = Postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def base_url(server) -> str:
    return server.url


@pytest.fixture(scope="session")
def eos_id(tiny_model, homes) -> int:
    import json

    from huggingface_hub import try_to_load_from_cache

    return json.loads(Path(try_to_load_from_cache(tiny_model, "config.json")).read_text())["eos_token_id"]


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, driven by Playwright (`make test` installs it).
    Module-scoped on purpose: Playwright's sync API runs an event loop in this
    thread while it is open, and later tests call asyncio.run()."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A desktop-sized page; any page error or console error fails the test,
    but the browser's own line for a 4xx from a path in `page.refusals_expected`
    (a test that provokes a refusal adds its path there)."""
    from urllib.parse import urlsplit

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.refusals_expected = set()
    errors: list[str] = []

    def console(message) -> None:
        if message.type != "error":
            return
        path = urlsplit((message.location or {}).get("url", "")).path
        if not (message.text.startswith("Failed to load resource") and path in page.refusals_expected):
            errors.append(message.text)

    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", console)
    yield page
    context.close()
    assert not errors, errors
