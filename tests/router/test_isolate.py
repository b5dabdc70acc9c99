"""`hearth serve MODEL --isolate`: the model in a process of its own behind
the web server (router mode's machinery over one model). The process is the
point, so one real server: its engine killed, started again, the web
server and its stored turns untouched. The model process's POST
/admin/drain, the refusals and the shared store of Responses turns run in
this process."""
from __future__ import annotations

import os
import signal
import time

import httpx
import openai
import pytest

from inference.protocols.response_store import FolderResponseStore
from serving.demo import speech_data
from tests.helpers import ServerProcess, server_env
from tests.inproc import refusal, serving

HTTP = httpx.Client(timeout=120)


@pytest.fixture(scope="module")
def isolated(homes, tiny_model, tmp_path_factory):
    """The tiny model isolated, an untrained Whisper beside it (router mode's transcription)."""
    from serving.demo.whisper_build import write_random

    whisper = write_random(tmp_path_factory.mktemp("whisper") / "tiny-whisper")
    proc = ServerProcess(server_env(*homes), tiny_model, "--isolate", "--no-worker", "--whisper-model", str(whisper),
                         log_path=tmp_path_factory.mktemp("logs") / "isolated.log").wait_ready()
    yield proc
    assert proc.stop() == 0, proc.output()


def _engine(url: str, status: str, restarts: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = HTTP.get(url + "/engine").json()
        if body["status"]["value"] == status and body["restarts"] == restarts:
            return body
        time.sleep(0.1)
    raise AssertionError(f"the engine never became {status} after {restarts} restarts: {body}")


def test_a_killed_engine_is_started_again_and_the_server_keeps_its_turns(isolated, tiny_model):
    """The engine's process dies (SIGKILL): the web server stays up, starts
    it again, and a Responses turn stored before the crash continues after."""
    client = openai.OpenAI(base_url=isolated.url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=tiny_model, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
    assert reply.model == tiny_model and reply.choices[0].message.content is not None
    first = client.responses.create(model=tiny_model, input="remember this", max_output_tokens=3)

    before = _engine(isolated.url, "loaded", 0)
    assert before["isolated"] is True and before["model"] == tiny_model and before["last_exit"] is None
    assert before["response_store"]["backend"] == "folder" and before["response_store"]["entries"] == 1
    listing = HTTP.get(isolated.url + "/models").json()
    assert listing["isolated"] is True and [r["id"] for r in listing["data"]] == [tiny_model]

    os.kill(before["pid"], signal.SIGKILL)
    after = _engine(isolated.url, "loaded", 1)
    assert after["pid"] != before["pid"] and after["port"] != before["port"]
    assert after["last_exit"]["reason"] == "killed by SIGKILL"
    assert isolated.proc.poll() is None  # the web server never went down
    assert "starting its process again (restart 1)" in isolated.output()

    # Stored by the process that died, continued by the new one.
    second = client.responses.create(model=tiny_model, input="and now?", previous_response_id=first.id,
                                     max_output_tokens=3)
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).id == first.id
    assert HTTP.get(isolated.url + "/engine").json()["response_store"]["entries"] == 2


def test_transcription_goes_to_the_models_process(isolated, tiny_model):
    """Router mode's transcription: `whisper-1` (or no model) is answered by
    the default model's process, which has the Whisper model; sessions too."""
    assert HTTP.get(isolated.url + "/v1").json()["transcription"] is True
    client = openai.OpenAI(base_url=isolated.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    wav = speech_data.to_wav(speech_data.say("four seven"))
    text = client.audio.transcriptions.create(model="whisper-1", file=("d.wav", wav, "audio/wav"), temperature=0)
    assert isinstance(text.text, str)
    named = HTTP.post(isolated.url + "/v1/audio/transcriptions", data={"model": tiny_model, "vad": "true"},
                      files={"file": ("d.wav", wav, "audio/wav")})
    assert named.status_code == 200 and named.json()["hearth"]["vad"]["speech"] is True
    url = isolated.url + "/v1/audio/sessions"
    sid = HTTP.post(url, json={"temperature": 0}).json()["id"]
    chunk = HTTP.post(f"{url}/{sid}/audio", content=speech_data.say("one").tobytes(),
                      headers={"content-type": "audio/pcm;rate=16000"})
    assert chunk.status_code == 200 and chunk.json()["speech"] is True
    assert isinstance(HTTP.post(f"{url}/{sid}/finish").json()["text"], str)


def test_an_unload_drains_the_engine_first_and_the_next_request_loads_it(isolated, tiny_model):
    unloaded = HTTP.post(isolated.url + "/models/unload", json={"model": tiny_model})
    assert unloaded.status_code == 200, unloaded.text
    engine = HTTP.get(isolated.url + "/engine").json()
    assert engine["status"]["value"] == "unloaded" and engine["pid"] is None
    drain = engine["last_drain"]
    assert drain["drained"] is True and drain["idle"] is True and drain["flush"]["durable"] is True
    assert drain["demotions"] == drain["flush"]["flushedSnapshots"]
    restarts = engine["restarts"]  # an unload asked for is no crash: not started again by itself
    other = HTTP.post(isolated.url + "/models/load", json={"model": "org/another-model"})
    assert other.status_code == 400 and other.json()["error"]["code"] == "model_not_found"  # nothing downloaded
    reply = HTTP.post(isolated.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "back?"}], "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert _engine(isolated.url, "loaded", restarts)["pid"] is not None


def test_isolate_refuses_what_it_cannot_do(tiny_model):
    assert "--isolate serves one MODEL" in refusal("--isolate")
    assert "--models-max is for router mode" in refusal(tiny_model, "--isolate", "--models-max", "2")
    assert "neither a directory nor a repo" in refusal("no-such/model", "--isolate")


def test_engine_is_answered_only_under_isolate(inproc):
    reply = inproc.get("/engine")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_isolated"


def test_drain_in_a_model_process_refuses_new_requests_then_writes_the_cache(tiny_model, tmp_path):
    with serving(tiny_model, "--ssd-cache", str(tmp_path / "ssd")) as app:
        refused = app.post("/admin/drain", json={})
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_a_model_process"
        assert app.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "warm"}],
                                                      "max_tokens": 2}).status_code == 200
        with open(os.devnull, "wb") as pipe:
            os.environ["HEARTH_ROUTER_FD"] = str(pipe.fileno())  # this process is a router's now
            bad = app.post("/admin/drain", json={"drain_seconds": -1})
            assert bad.status_code == 400 and "drain_seconds" in bad.text
            drained = app.post("/admin/drain", json={"drain_seconds": 5, "flush_seconds": 30})
            assert drained.status_code == 200, drained.text
            body = drained.json()
            assert body["drained"] is True and body["flush"]["durable"] is True
            assert body["flush"]["entries"] >= 1  # the warm prompt is on the SSD tier
            after = app.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "late"}]})
            assert after.status_code == 503 and after.headers["x-hearth-draining"] == "1"


def test_each_router_locks_a_folder_of_its_own_and_clears_abandoned_ones(tmp_path, monkeypatch):
    from hearth import router_mode

    monkeypatch.setenv("HEARTH_HOME", str(tmp_path))
    mine = router_mode.responses_folder()
    dead = tmp_path / "responses" / "router-1-dead"
    (dead / "resp_x.json").parent.mkdir()
    (tmp_path / "responses" / "owners" / "1-dead.lock").write_bytes(b"")  # its router is gone: no one holds it
    second = router_mode.responses_folder()
    assert mine is not None and second is not None and mine != second
    assert mine.is_dir() and second.is_dir() and not dead.exists()  # a live router's folder stays
    store = FolderResponseStore(second)
    import shutil

    shutil.rmtree(second)  # removed under a running store: the next turn makes it again
    store.put({"id": "resp_again"}, [], [], None)
    assert store.get("resp_again") is not None and oct((second / "resp_again.json").stat().st_mode & 0o777) == "0o600"


def test_the_folder_store_is_shared_bounded_and_kept_per_holder(tmp_path):
    one, two = FolderResponseStore(tmp_path, ttl_s=60, max_bytes=4000), FolderResponseStore(tmp_path, ttl_s=60,
                                                                                            max_bytes=4000)
    turn = {"id": "resp_a", "object": "response"}
    one.put(turn, [{"role": "user", "content": "x"}], [], None, holder="h1")
    assert two.get("resp_a", "h1").messages == [{"role": "user", "content": "x"}]  # another process sees it
    assert two.get("resp_a", "h2") is None and not two.delete("resp_a", "h2")
    assert two.get("../resp_a") is None and two.get("resp_a/") is None  # an id is never a path
    for n in range(8):  # about 1 kB each: the least recently read go past the cap
        one.put({"id": f"resp_{n}", "filler": "y" * 900}, [], [], None)
        time.sleep(0.01)
    assert two.stats()["bytes"] <= 4000 and two.get("resp_7") is not None and two.get("resp_0") is None
    assert one.delete("resp_7") and two.get("resp_7") is None
    expired = FolderResponseStore(tmp_path / "short", ttl_s=0.2)
    expired.put({"id": "resp_old"}, [], [], None)
    time.sleep(0.3)
    assert expired.get("resp_old") is None and expired.stats()["entries"] == 0
