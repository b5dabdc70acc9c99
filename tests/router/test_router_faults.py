"""Router mode's faults: a model's process that stops answering (SIGSTOP:
as a deadlocked or swapped-out process): the request waiting on it gets its
error after --child-timeout, the router asks the process's /health, and a
process that does not answer that either is killed, so the next request
loads the model afresh rather than waiting as long again; unloading a
hung process kills it rather than waiting minutes for its drain. A model
whose weights are corrupt fails its load with the reason, and requests for
it are answered that at once for a while rather than each starting a
process that fails again."""
from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.helpers import ServerProcess, build_tiny_model, server_env

pytestmark = pytest.mark.slow  # `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)

MODEL, BROKEN = "hearth-test/stall", "hearth-test/broken"
HTTP = httpx.Client(timeout=120)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    root = tmp_path_factory.mktemp("stall")
    build_tiny_model(root / "hf" / "hub", MODEL)
    broken = build_tiny_model(root / "hf" / "hub", BROKEN) / "model.safetensors"
    broken.resolve().write_bytes(b"\x10" * 1000)  # not safetensors: its header length is nonsense
    proc = ServerProcess(server_env(root / "hf", root / "hearth"), "--default-model", MODEL, "--no-worker",
                         "--child-timeout", "8", log_path=root / "router.log").wait_ready()
    yield proc
    assert proc.stop() == 0, proc.output()


def _row(url: str, model: str = MODEL) -> dict:
    return next(r for r in HTTP.get(url + "/models").json()["data"] if r["id"] == model)


def _chat(url: str, model: str = MODEL) -> httpx.Response:
    return HTTP.post(url + "/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})


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


def test_a_model_that_fails_to_load_is_not_loaded_again_by_every_request(router):
    first = _chat(router.url, BROKEN)
    assert first.status_code == 503 and first.json()["error"]["code"] == "model_load_failed", first.text
    assert "safetensors" in first.json()["error"]["message"]  # the loader's own reason
    row = _row(router.url, BROKEN)
    assert row["status"]["value"] == "failed" and row["pid"] is None
    for _ in range(3):  # a client retrying: the same answer, with no process started for it
        again = _chat(router.url, BROKEN)
        assert again.status_code == 503 and again.json()["error"]["code"] == "model_load_failed"
        message = again.json()["error"]["message"]
        assert "failed to load" in message and "s ago" in message and "safetensors" in message, message
    assert _chat(router.url).status_code == 200  # the other model serves throughout
    asked = HTTP.post(router.url + "/models/load", json={"model": BROKEN})  # tries again at once
    assert asked.status_code == 503 and "s ago" not in asked.json()["error"]["message"], asked.text
