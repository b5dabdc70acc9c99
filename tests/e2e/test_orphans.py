"""Nothing a Hearth process starts outlives it (`core.procs.spawn`).

One router (`hearth serve --build-demo --allow-client-templates`) holds one
of each kind of child: the background demo build, the job worker and a job
child under it, a model's process with its template sandboxes under it,
and the router's own template sandboxes. Each kind of parent is killed
with SIGKILL in turn (the model's process, the worker, the router) and
every process below it is gone within seconds. The same server shows the
demo model served from its first checkpoint while it trains, and the demo
speech model waiting for it, with transcription refused meanwhile. The bash
tool's reaper, started from a process that is then killed, ends its tree."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import psutil
import pytest

from serving.demo import speech_data
from tests.helpers import ROOT, TINY_REPO, ServerProcess, build_tiny_model, exited, server_env

pytestmark = pytest.mark.slow  # `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)

GONE_WITHIN_S = 10.0  # a model process drains and flushes its prompt cache first (SIGTERM)


def _gone(procs: list[psutil.Process], within: float = GONE_WITHIN_S) -> None:
    deadline = time.monotonic() + within
    for proc in procs:
        while not exited(proc):
            assert time.monotonic() < deadline, f"outlived its parent: {' '.join(proc.cmdline())}"
            time.sleep(0.05)


def _kill(proc: psutil.Process) -> list[psutil.Process]:
    """SIGKILL `proc`; the processes that were below it."""
    below = proc.children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    return below


def _named(procs: list[psutil.Process], text: str) -> list[psutil.Process]:
    found = []
    for proc in procs:
        try:
            if text in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def _wait(what: str, check, timeout: float = 120.0, pause: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout:g}s for {what}"
        time.sleep(pause)


@pytest.fixture
def router(tmp_path):
    hf, hearth = tmp_path / "hf", tmp_path / "hearth"
    build_tiny_model(hf / "hub")  # a library of its own: the demo build publishes into it
    env = dict(server_env(hf, hearth), HEARTH_JOB_STAGE_DELAY="60")
    server = ServerProcess(env, "--default-model", TINY_REPO, "--build-demo", "--allow-client-templates",
                           log_path=tmp_path / "router.log")
    try:
        yield server.wait_ready(), psutil.Process(server.proc.pid)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.stop()


def _slot(url: str, model: str) -> dict:
    return next((m for m in httpx.get(url + "/models").json()["data"] if m["id"] == model), {})


def test_every_kind_of_parent_killed_leaves_no_child(router, tmp_path):
    server, top = router
    url = server.url
    _wait("the default model", lambda: _slot(url, TINY_REPO).get("status", {}).get("value") == "loaded")

    # A model's process: its template sandboxes go with it.
    model = _named(top.children(), f"serve {TINY_REPO}")[0]
    sandboxes = _wait("its template sandboxes", lambda: _named(model.children(), "template_worker"))
    _gone(_kill(model))
    assert sandboxes

    # The worker: the job child running a fine-tune goes with it.
    data = tmp_path / "data"
    data.mkdir()
    row = json.dumps({"messages": [{"role": "user", "content": "Say it."}, {"role": "assistant", "content": "It."}]})
    (data / "train.jsonl").write_text("\n".join([row] * 8) + "\n")
    body = {"model_dir": TINY_REPO, "data_dir": str(data), "adapter_path": str(tmp_path / "adapter"),
            "iters": 20, "learning_rate": 1e-3, "rank": 8, "batch_size": 4, "steps_per_report": 5}
    answer = httpx.post(url + "/api/finetune/submit", json=body)
    assert answer.status_code == 200, answer.text
    worker = _named(top.children(), "hearth.cli worker")[0]
    job_child = _wait("the job's child", lambda: _named(worker.children(), "jobs.child"))
    _gone(_kill(worker))
    assert job_child

    # The demo model, trained in the background, is served from its first checkpoint.
    build = _wait("the demo build", lambda: httpx.get(url + "/health").json().get("demo_build"))
    assert build["model"] == "hearth/demo-chat" and build["steps"] == 500
    _wait("the demo's first checkpoint",
          lambda: httpx.get(url + "/health").json()["demo_build"]["served_step"] is not None, timeout=300, pause=1.0)
    reply = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": "hearth/demo-chat", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
    assert reply.status_code == 200 and reply.json()["model"] == "hearth/demo-chat", reply.text
    stats = httpx.get(url + "/stats").json()
    assert stats["demo_build"]["state"] in ("training", "done") and stats["demo_build"]["served_step"] is not None
    # The library has no Whisper: the demo speech model is built after the chat model, and until it is,
    # transcription is refused with a 503 that says so (in OpenAI's shape, through the SDK).
    speech = httpx.get(url + "/health").json()["speech_build"]
    assert (speech["state"], speech["model"], speech["steps"]) == ("waiting", "hearth/demo-whisper", 400), speech
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        client.audio.transcriptions.create(model="whisper-1", file=("take.wav", speech_data.to_wav(
            np.zeros(16000, np.float32))))
    assert refused.value.status_code == 503, refused.value
    assert "demo speech model hearth/demo-whisper is being built" in refused.value.message
    assert "once the demo chat model is trained" in refused.value.message

    # The router: the build, the new worker, the demo's process and every sandbox go with it.
    below = top.children(recursive=True)
    for kind in ("make-demo-model --kind chat --background", "hearth.cli worker", "serve hearth/demo-chat",
                 "template_worker"):
        assert _named(below, kind), (kind, [" ".join(p.cmdline()) for p in below])
    _gone(_kill(top))


REAPED = """
import os, subprocess, sys
from core import procs
tool = subprocess.Popen([sys.executable, "-I", "chat/reaper.py", "bash", "-c", "sleep 300 & sleep 300"],
                        **procs.tied(on_parent_exit=15))
print(tool.pid, flush=True)
tool.wait()
"""


def test_a_tool_command_ends_with_the_server_that_ran_it():
    """The bash tool's reaper (started as chat/tools.py starts it) ends its
    whole tree when the process that started it is killed."""
    server = subprocess.Popen([sys.executable, "-c", REAPED], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    reaper = psutil.Process(int(server.stdout.readline()))
    tree = _wait("the command's processes", lambda: len(reaper.children(recursive=True)) >= 2 and
                 reaper.children(recursive=True))
    server.kill()
    server.wait()
    server.stdout.close()
    _gone([reaper, *tree])

