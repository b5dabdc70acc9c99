"""Router mode with a model's process that stops answering (SIGSTOP: as a
deadlocked or swapped-out process): the request waiting on it gets its
error after --child-timeout, the router asks the process's /health, and a
process that does not answer that either is killed, so the next request
loads the model afresh rather than waiting as long again; unloading a
hung process kills it rather than waiting minutes for its drain."""
from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.helpers import ServerProcess, build_tiny_model, server_env

MODEL = "hearth-test/stall"
HTTP = httpx.Client(timeout=120)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    root = tmp_path_factory.mktemp("stall")
    build_tiny_model(root / "hf" / "hub", MODEL)
    proc = ServerProcess(server_env(root / "hf", root / "hearth"), "--default-model", MODEL, "--no-worker",
                         "--child-timeout", "8", log_path=root / "router.log").wait_ready()
    yield proc
    assert proc.stop() == 0, proc.output()


def _row(url: str) -> dict:
    return next(r for r in HTTP.get(url + "/models").json()["data"] if r["id"] == MODEL)


def _chat(url: str) -> httpx.Response:
    return HTTP.post(url + "/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # exited, not yet reaped
    except FileNotFoundError:
        return True


def _until(what: str, check, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _stopped(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def _cleanup(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_process_that_stops_answering_is_killed_and_the_next_request_loads_it_again(router):
    assert _chat(router.url).status_code == 200
    pid = _row(router.url)["pid"]
    _stopped(pid)
    try:
        waited = _chat(router.url)
        assert waited.status_code == 504 and waited.json()["error"]["code"] == "model_timeout", waited.text
        _until("the hung process is killed", lambda: _gone(pid) and _row(router.url)["status"]["value"] == "unloaded")
        assert "stopped answering" in _row(router.url)["status"]["error"]
    finally:
        _cleanup(pid)
    again = _chat(router.url)  # loads it afresh
    assert again.status_code == 200, again.text
    assert _row(router.url)["pid"] not in (None, pid)


def test_unloading_a_hung_process_kills_it(router):
    assert _chat(router.url).status_code == 200
    pid = _row(router.url)["pid"]
    _stopped(pid)
    try:
        r = HTTP.post(router.url + "/models/unload", json={"model": MODEL})  # its drain would wait minutes
        assert r.status_code == 200 and r.json()["status"]["value"] == "unloaded", r.text
        _until("the hung process is gone", lambda: _gone(pid))
    finally:
        _cleanup(pid)
    assert _chat(router.url).status_code == 200
