from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Every test, and every server it starts, works in throwaway homes.
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="hearth-tests-"))
os.environ["HEARTH_HOME"] = str(_SESSION_DIR / "hearth")
os.environ["HF_HOME"] = str(_SESSION_DIR / "hf")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("HF_HUB_CACHE", None)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Tests keep their fixture files in pytest's temporary folders; servers may
# read them because the run allows that folder, as `--allow-path` would.
_TMP_DIR = _SESSION_DIR / "tmp"
os.environ["HEARTH_ALLOW_PATHS"] = str(_TMP_DIR)

from tests.helpers import TINY_REPO, ServerProcess, build_tiny_model, server_env  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # Before the tmp_path factory reads it: every tmp_path lies in the allowed folder.
    if config.option.basetemp:
        os.environ["HEARTH_ALLOW_PATHS"] = str(Path(config.option.basetemp).resolve())
    else:
        config.option.basetemp = str(_TMP_DIR)


def pytest_sessionfinish(session, exitstatus):
    # Servers and models live under one temporary folder; nothing outlives the run.
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def homes() -> tuple[Path, Path]:
    return Path(os.environ["HF_HOME"]), Path(os.environ["HEARTH_HOME"])


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


@pytest.fixture(scope="session")
def demo_homes(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    return root / "hf", root / "hearth"


@pytest.fixture(scope="session")
def demo_build(demo_homes):
    """`hearth make-demo-model` once per run (a few minutes); the demo tests and
    the memory synthesis tests share the model it builds."""
    import subprocess

    from tests.helpers import HEARTH, ROOT

    done = subprocess.run([*HEARTH, "make-demo-model"], cwd=ROOT, env=server_env(*demo_homes), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


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
    """A desktop-sized page; any page error or console error fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield page
    context.close()
    assert not errors, errors
