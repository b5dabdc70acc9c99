"""Router children on other hosts (`--models-remote`): a second `hearth
serve` with a key of its own, in homes of its own (standing in for another
machine), serves a model the router's library lacks. The router lists it
with its host's health and /fit capacity, forwards requests for it with the
hop's key (the client's own key stays with the router), reports it failed
once its host stops answering, and serves it again when the host is back."""
from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.helpers import ServerProcess, build_tiny_model, server_env

pytestmark = pytest.mark.slow  # `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)

LOCAL, REMOTE = "hearth-test/tiny-local", "hearth-test/tiny-remote"
ROUTER_KEY, REMOTE_KEY = "router-key-1", "remote-key-2"
HTTP = httpx.Client(timeout=120, headers={"authorization": f"Bearer {ROUTER_KEY}"})


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote")
    build_tiny_model(root / "local-hf" / "hub", LOCAL)
    build_tiny_model(root / "remote-hf" / "hub", REMOTE)
    return root


def _host(homes) -> ServerProcess:
    env = server_env(homes / "remote-hf", homes / "remote-hearth")
    return ServerProcess(env, REMOTE, "--api-key", REMOTE_KEY, "--no-worker", log_path=homes / "host.log").wait_ready()


@pytest.fixture(scope="module")
def host(homes):
    proc = _host(homes)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def router(homes, host):
    env = server_env(homes / "local-hf", homes / "local-hearth")
    proc = ServerProcess(env, "--default-model", LOCAL, "--no-worker", "--api-key", ROUTER_KEY,
                         "--models-remote", host.url, "--models-remote-key", REMOTE_KEY,
                         log_path=homes / "router.log").wait_ready()
    yield proc
    assert proc.stop() == 0, proc.output()


def _row(router, model: str) -> dict:
    return {r["id"]: r for r in HTTP.get(router.url + "/models").json()["data"]}[model]


def _wait(router, model: str, value: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = _row(router, model)
        if row["status"]["value"] == value:
            return row
        time.sleep(0.5)
    raise AssertionError(f"{model} never became {value}: {row}")


def test_a_remote_model_is_listed_with_its_host(router, host):
    row = _row(router, REMOTE)
    assert row["status"]["value"] == "loaded" and row["remote"]["healthy"] is True
    assert row["remote"]["url"] == host.url and row["pid"] is None and "remote" in row["tags"]
    deadline = time.monotonic() + 60  # a busy host's /fit may miss a probe; the next one (every 5 s) asks again
    while row["remote"]["capacity"] is None and time.monotonic() < deadline:
        time.sleep(0.5)
        row = _row(router, REMOTE)
    capacity = row["remote"]["capacity"]
    assert capacity["model"] == REMOTE and capacity["context_tokens"] > 0 and capacity["usable_bytes"] > 0
    assert _row(router, LOCAL)["remote"] is None
    ids = [m.id for m in openai.OpenAI(base_url=router.url + "/v1", api_key=ROUTER_KEY).models.list().data]
    assert REMOTE in ids and LOCAL in ids


def test_requests_reach_the_remote_with_the_hops_key(router, host):
    client = openai.OpenAI(base_url=router.url + "/v1", api_key=ROUTER_KEY, max_retries=0)
    reply = client.chat.completions.create(model=REMOTE, max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.model == REMOTE and reply.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model=REMOTE, max_tokens=4, stream=True,
                                                 messages=[{"role": "user", "content": "hi"}]))
    assert chunks and chunks[-1].choices[0].finish_reason is not None
    # The router's key does not open the remote host: only the hop's key went there.
    assert httpx.get(host.url + "/v1/models", headers={"authorization": f"Bearer {ROUTER_KEY}"}).status_code == 401
    refused = HTTP.post(router.url + "/models/unload", json={"model": REMOTE})
    assert refused.status_code == 400 and "unload it there" in refused.json()["error"]["message"]


def test_a_host_that_goes_away_is_failed_and_comes_back(router, host, homes):
    port = host.port
    host.stop()
    row = _wait(router, REMOTE, "failed")
    assert "unreachable" in row["status"]["error"] or "stopped answering" in row["status"]["error"]
    gone = HTTP.post(router.url + "/v1/chat/completions",
                     json={"model": REMOTE, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert gone.status_code == 503 and host.url in gone.json()["error"]["message"]
    # The local model is untouched meanwhile.
    local = HTTP.post(router.url + "/v1/chat/completions",
                      json={"model": LOCAL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert local.status_code == 200
    back = _start_on(server_env(homes / "remote-hf", homes / "remote-hearth"), port, homes)  # back at its address
    try:
        _wait(router, REMOTE, "loaded", timeout=60)
        ok = HTTP.post(router.url + "/v1/chat/completions",
                       json={"model": REMOTE, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200 and ok.json()["model"] == REMOTE
    finally:
        back.terminate()
        back.wait(30)


def _start_on(env: dict, port: int, homes):
    import subprocess

    from tests.helpers import HEARTH, ROOT

    log = open(homes / "host-back.log", "wb")
    proc = subprocess.Popen([*HEARTH, "serve", REMOTE, "--api-key", REMOTE_KEY, "--no-worker", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError((homes / "host-back.log").read_text())


def test_a_bad_remote_url_is_refused_at_start(homes, monkeypatch):
    """In this process: serve's checks before it starts anything refuse it (a CommandError, which
    `hearth` prints without a traceback and exits 1 for: tests/e2e/test_cli.py runs that path)."""
    from huggingface_hub import constants

    from tests.inproc import refusal

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(homes / "local-hf" / "hub"))  # the router's library
    refused = refusal("--default-model", LOCAL, "--no-worker", "--models-remote", "ftp://example/x")
    assert "give a URL such as http://host:8080" in refused
