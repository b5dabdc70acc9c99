"""Router mode over real processes: `hearth serve` without a model, two tiny
models built here, each loaded into its own child process on demand."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time

import anthropic
import httpx
import openai
import pytest
import websockets

from tests.helpers import ServerProcess, build_tiny_model, server_env, sse_events
from tests.inproc import refusal

A, B = "hearth-test/tiny-a", "hearth-test/tiny-b"
# Loads and unloads wait for a process to start or drain: far longer than httpx's 5 s default on a busy machine.
HTTP = httpx.Client(timeout=120)
PRESET = """\
# two tiny models
[*]
max-tokens = 8          ; every model's default cap
tags = tiny

[hearth-test/tiny-b]
alias = b, second-model  # two names for it
tags = test
temperature = 0
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """Homes whose HF cache holds the two tiny models and nothing else."""
    root = tmp_path_factory.mktemp("router")
    hf, hearth = root / "hf", root / "hearth"
    build_tiny_model(hf / "hub", A)
    build_tiny_model(hf / "hub", B, heads=2)
    preset = root / "models.ini"
    preset.write_text(PRESET)
    return hf, hearth, preset


def _router(library, tmp_path_factory, *args: str) -> ServerProcess:
    hf, hearth, preset = library
    env = server_env(hf, hearth)
    log = tmp_path_factory.mktemp("logs") / "router.log"
    return ServerProcess(env, "--default-model", A, "--models-preset", str(preset), "--no-worker", *args,
                         log_path=log).wait_ready()


@pytest.fixture(scope="module")
def two(library, tmp_path_factory):
    """A router that may hold both models at once."""
    proc = _router(library, tmp_path_factory, "--models-max", "2")
    yield proc
    assert proc.stop() == 0, proc.output()


@pytest.fixture(scope="module")
def one(library, tmp_path_factory):
    """A router that holds one model at a time, and unloads an idle one after 2 s."""
    proc = _router(library, tmp_path_factory, "--models-max", "1", "--no-preload", "--idle-unload", "2")
    yield proc
    assert proc.stop() == 0, proc.output()


def _rows(url: str) -> dict[str, dict]:
    return {r["id"]: r for r in HTTP.get(url + "/models").json()["data"]}


def _wait_status(url: str, model: str, value: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = _rows(url)[model]
        if row["status"]["value"] == value:
            return row
        time.sleep(0.1)
    raise AssertionError(f"{model} never became {value}: {_rows(url)[model]}")


def _chat(url: str, model: str | None, **extra) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, **extra}
    if model is not None:
        body["model"] = model
    return HTTP.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_lists_every_model_with_status_aliases_and_tags(two):
    listing = HTTP.get(two.url + "/models").json()
    assert listing["mode"] == "router" and listing["default"] == A and listing["models_max"] == 2
    rows = {r["id"]: r for r in listing["data"]}
    assert set(rows) == {A, B}
    assert rows[B]["aliases"] == ["b", "second-model"] and rows[B]["tags"] == ["tiny", "test"]
    assert rows[A]["aliases"] == [] and rows[A]["tags"] == ["tiny"] and rows[A]["default"] is True
    _wait_status(two.url, A, "loaded")  # the default loads at start
    v1 = {m["id"]: m for m in HTTP.get(two.url + "/v1/models").json()["data"]}
    assert set(v1) == {A, B} and v1[A]["status"]["value"] == "loaded"
    assert v1[A]["context_window"] == 2048  # a loaded model's row carries what its process says
    assert v1[B]["aliases"] == ["b", "second-model"]
    assert HTTP.get(two.url + "/v1/models/b").json()["id"] == B  # by alias
    assert HTTP.get(two.url + "/v1/models/nobody").status_code == 404


def test_routes_by_model_id_alias_and_default(two):
    assert _chat(two.url, None).json()["model"] == A
    assert _chat(two.url, "default").json()["model"] == A
    assert _chat(two.url, "b").json()["model"] == B
    assert _chat(two.url, "second-model").json()["model"] == B
    assert _rows(two.url)[B]["status"]["value"] == "loaded"
    # the preset's [*] max-tokens reached both children
    assert _chat(two.url, B, max_tokens=None).json()["usage"]["completion_tokens"] <= 8


def test_the_device_is_logged_once_however_many_models_load(two):
    """The router says which device serves, once; each model's process, which
    computes on it, does not say it again (a user reads one serve's log)."""
    assert _chat(two.url, A).status_code == 200 and _chat(two.url, B).status_code == 200
    assert two.output().count("Device:") == 1, two.output()[-3000:]


def test_the_trace_id_reaches_the_models_process(two):
    """The router hands its trace id (the client's, or one it made) to the child, which logs it."""
    sent = HTTP.post(two.url + "/v1/chat/completions", headers={"X-Hearth-Trace-Id": "through-the-router"},
                     json={"model": B, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, timeout=120)
    assert sent.status_code == 200 and sent.headers["x-hearth-trace-id"] == "through-the-router"
    made = _chat(two.url, B).headers["x-hearth-trace-id"]
    deadline = time.monotonic() + 10  # the child's log lines reach the router's stderr
    while not all(f"trace={t} POST /v1/chat/completions" in two.output() for t in ("through-the-router", made)):
        assert time.monotonic() < deadline, two.output()[-2000:]
        time.sleep(0.1)


def test_props_come_from_the_named_models_process(two):
    assert HTTP.get(two.url + "/props").json()["model_alias"] == A  # the default
    assert HTTP.get(two.url + "/props", params={"model": "b"}).json()["model_alias"] == B


def test_unknown_model_is_a_400_naming_it_in_each_protocol(two):
    r = _chat(two.url, "nobody/nothing")
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"].startswith("model 'nobody/nothing' not found") and "/v1/models" in error["message"]
    assert error["param"] == "model" and error["code"] == "model_not_found"
    r = HTTP.post(two.url + "/v1/messages", json={"model": "x", "max_tokens": 4,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["message"].startswith("model 'x' not found")
    assert HTTP.post(two.url + "/models/load", json={"model": "x"}).status_code == 400
    # A `model` that is not a string: refused as a model's process words it (its Schema), in each shape.
    r = HTTP.post(two.url + "/v1/chat/completions",
                  json={"model": ["x"], "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
    assert r.json()["error"]["message"] == "model: Input should be a valid string"
    r = HTTP.post(two.url + "/v1/messages", json={"model": {"id": A}, "max_tokens": 4, "stream": True,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["message"] == "model: Input should be a valid string"


def test_sdks_through_the_router(two):
    client = openai.OpenAI(base_url=two.url + "/v1", api_key="unused")
    assert {m.id for m in client.models.list()} == {A, B}
    reply = client.chat.completions.create(model="b", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert reply.model == B
    chunks = list(client.chat.completions.create(model=A, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=3, stream=True))
    assert chunks[0].model == A and chunks[-1].choices[0].finish_reason == "length"
    claude = anthropic.Anthropic(base_url=two.url, api_key="unused")
    message = claude.messages.create(model="second-model", max_tokens=3, messages=[{"role": "user", "content": "Hi"}])
    assert message.model == B
    # a stored Responses turn is in the store the router shares with its models: found by the router,
    # continued on the other model
    first = client.responses.create(model="b", input="Hi", max_output_tokens=3)
    assert client.responses.retrieve(first.id).id == first.id
    follow = client.responses.create(model=A, input="and?", previous_response_id=first.id, max_output_tokens=3)
    assert follow.model == A and follow.previous_response_id == first.id
    # its items are taken by reference on the other model, and the router lists a turn's input items
    (asked,) = client.responses.input_items.list(first.id)
    assert asked.role == "user" and asked.content[0].text == "Hi"
    refs = [first.output[-1].id, asked.id]
    by_ref = client.responses.create(model=A, input=[{"type": "item_reference", "id": i} for i in refs],
                                     max_output_tokens=3)
    assert by_ref.model == A and [i.id for i in client.responses.input_items.list(by_ref.id, order="asc")] == refs
    client.responses.delete(follow.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(follow.id)


def test_concurrent_requests_to_both_models(two):
    results: list = []

    def ask(model):
        results.append(_chat(two.url, model, max_tokens=6))

    threads = [threading.Thread(target=ask, args=(m,)) for m in (A, B) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200] * 8
    assert sorted(r.json()["model"] for r in results) == [A] * 4 + [B] * 4
    rows = _rows(two.url)
    assert rows[A]["status"]["value"] == rows[B]["status"]["value"] == "loaded"
    assert rows[A]["pid"] != rows[B]["pid"]


def test_a_browser_write_through_the_router_reaches_the_model(two):
    """The dashboard's own writes (same origin) pass the router's checks and
    are not refused again by the model's process, which listens elsewhere."""
    own = {"Origin": two.url, "Sec-Fetch-Site": "same-origin"}
    r = HTTP.post(two.url + "/v1/chat/completions", headers=own, timeout=60,
                   json={"model": B, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    foreign = HTTP.post(two.url + "/v1/chat/completions", headers={"Origin": "http://elsewhere.example"},
                         json={"model": B, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert foreign.status_code == 403  # refused by the router itself
    index = HTTP.get(two.url + "/v1/").json()
    assert index["mode"] == "router" and index["model"] == A


def test_model_routes_outside_v1_go_to_the_named_model(two):
    assert HTTP.get(two.url + "/fit", params={"model": "b"}, timeout=60).json()["model"] == B
    assert HTTP.get(two.url + "/fit", timeout=60).json()["model"] == A
    flushed = HTTP.post(two.url + "/admin/cache/flush", timeout=120).json()
    assert set(flushed["models"]) >= {A}


def test_a_refusal_by_a_models_process_is_logged_once(two):
    """A 400 from a model's process is in the log once, the process's own line (it names the model), not
    again by the router that relayed it."""
    line = "Bad Request: /v1/chat/completions"
    before = two.output().count(line)
    bad = HTTP.post(two.url + "/v1/chat/completions", json={"model": A, "max_tokens": -1,
                                                             "messages": [{"role": "user", "content": "Hi"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens", bad.text
    deadline = time.monotonic() + 30
    while two.output().count(line) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # both lines are written before the reply goes out; this is slack for the pipes
    new = [x for x in two.output().splitlines() if line in x][before:]
    assert len(new) == 1 and f"[{A}]" in new[0], new


def test_the_curve_designer_goes_to_the_named_model(two):
    signal = HTTP.post(two.url + "/signal", json={"prompt": "hi", "model": "b"})
    assert signal.status_code == 200 and sum(signal.json()["bins"]) == signal.json()["vocab"]
    assert signal.headers["access-control-allow-origin"] == "*"
    out = HTTP.post(two.url + "/generate", json={"prompt": "hi", "n": 2, "max_tokens": 4, "default": True})
    assert out.status_code == 200 and out.json()["mode"] == "default" and len(out.json()["samples"]) == 2
    bad = HTTP.post(two.url + "/generate", json={"prompt": "hi", "n": 0})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "n must be an integer from 1 to 8"
    pre = HTTP.options(two.url + "/signal", headers={"Origin": "https://lab.example",
                                                      "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "*"  # the router answers it
    assert HTTP.get(two.url + "/curves").status_code == 200


def test_stats_and_metrics_gather_the_models(two):
    _chat(two.url, A)
    _chat(two.url, B)
    stats = HTTP.get(two.url + "/stats").json()
    assert set(stats["router"]["loaded"]) == {A, B} and stats["router"]["models_max"] == 2
    assert stats["models"][A]["server"]["model"] == A and stats["models"][B]["server"]["model"] == B
    # The router's own bounds (what limits.md's example reads), the ones its models' processes were handed.
    assert stats["limits"]["max_body_bytes"] > 0 and stats["limits"] == stats["models"][A]["limits"]
    budgets = {stats["models"][m]["admission"]["memory_budget_bytes"] for m in (A, B)}
    (share,) = budgets  # each child got the same share of the machine's memory, none all of it
    assert 0 < share <= int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.75) // 2 + 1
    metrics = HTTP.get(two.url + "/metrics").text
    assert f'hearth_active_rows{{model="{A}"}}' in metrics and f'hearth_active_rows{{model="{B}"}}' in metrics
    assert metrics.count("# TYPE hearth_active_rows gauge") == 1  # one family, both models' series


def test_a_chat_longer_than_its_model_s_context_says_how_to_go_on(two):
    """The dashboard's chat on a router: a model's process refuses a conversation longer than its context,
    and the turn keeps that refusal with the chat's way on, as it does on one model's server: a message too
    long even alone is to be made shorter (older turns are left out by themselves)."""
    async def run():
        async with websockets.connect(two.url.replace("http", "ws") + "/ws/chat", max_size=None) as ws:
            while json.loads(await asyncio.wait_for(ws.recv(), 60))["type"] != "sessions":
                pass
            await ws.send(json.dumps({"type": "prompt", "text": "word " * 5000}))
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if frame["type"] == "error":
                    return frame

    error = asyncio.run(run())
    assert "maximum context length" in error["message"], error
    assert error["message"].endswith("this message does not fit even alone (with the system prompt and this "
                                     "turn's tool results): make it shorter."), error


def _eos(library, model: str) -> int:
    hf, _, _ = library
    config = next((hf / "hub" / f"models--{model.replace('/', '--')}").glob("snapshots/*/generation_config.json"))
    return json.loads(config.read_text())["eos_token_id"]


def test_a_json_body_labelled_a_form_goes_to_the_model_it_names(two):
    """`curl -d` without a content type labels a JSON body a form: the router reads it as the model's
    process does (JSON), so the model it names answers, never the default."""
    body = json.dumps({"model": B, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2})
    for stream in (False, True):
        raw = body if not stream else body[:-1] + ', "stream": true}'
        reply = HTTP.post(two.url + "/v1/chat/completions", content=raw,
                          headers={"content-type": "application/x-www-form-urlencoded"})
        assert reply.status_code == 200, reply.text
        model = reply.json()["model"] if not stream else json.loads(reply.text.split("data: ")[1])["model"]
        assert model == B, (stream, reply.text[:300])


def test_a_killed_child_fails_its_stream_then_loads_again(two, library):
    _chat(two.url, B)
    pid = _rows(two.url)[B]["pid"]
    body = {"model": B, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2000, "stream": True,
            "logit_bias": {str(_eos(library, B)): -100}}  # it runs until the kill
    frames = []
    with httpx.stream("POST", two.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"X-Conversation-Id": "killed-child"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                frames.append(line[6:])
                if len(frames) == 3:
                    os.kill(pid, signal.SIGKILL)
    error = json.loads(frames[-1])["error"]
    assert "tiny-b" in error["message"] and "loaded again" in error["message"]
    deadline = time.monotonic() + 30  # the recorded stream ends just after its last bytes went out
    while HTTP.get(f"{two.url}/v1/stream/killed-child").headers["x-stream-status"] == "live":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    replay = HTTP.get(f"{two.url}/v1/stream/killed-child")  # and says how it ended
    assert replay.headers["x-stream-status"] == "failed" and b"loaded again" in replay.content
    row = _wait_status(two.url, B, "unloaded")
    assert "SIGKILL" in row["status"]["error"] and row["pid"] is None
    assert _rows(two.url)[A]["status"]["value"] == "loaded"  # the other model never noticed
    assert _chat(two.url, A).status_code == 200
    again = _chat(two.url, B)
    assert again.status_code == 200 and again.json()["model"] == B
    assert _rows(two.url)[B]["pid"] not in (None, pid)


def _sequence_numbers(raw: bytes) -> list:
    return [json.loads(line[6:]).get("sequence_number") for line in raw.decode().splitlines()
            if line.startswith("data: ")]


def test_a_killed_childs_responses_stream_ends_on_the_next_sequence_number(two, library):
    """The error event the router adds when a model's process dies mid-reply
    is numbered after the last event relayed, as the client gets it and as
    the stream was recorded."""
    _chat(two.url, B)
    pid = _rows(two.url)[B]["pid"]
    body = {"model": B, "input": "Hello", "max_output_tokens": 2000, "stream": True,
            "logit_bias": {str(_eos(library, B)): -100}}  # it runs until the kill
    got, killed = b"", False
    with httpx.stream("POST", two.url + "/v1/responses", json=body, timeout=60,
                      headers={"X-Conversation-Id": "killed-child-responses"}) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            got += chunk
            if not killed and got.count(b"\n\n") >= 6:
                os.kill(pid, signal.SIGKILL)
                killed = True
    numbers = _sequence_numbers(got)
    assert numbers == list(range(len(numbers))) and len(numbers) > 6
    assert got.rsplit(b"\n\n", 2)[-2].startswith(b"event: error\n") and b"loaded again" in got
    deadline = time.monotonic() + 30
    while (replay := HTTP.get(f"{two.url}/v1/stream/killed-child-responses")).headers["x-stream-status"] == "live":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert replay.headers["x-stream-status"] == "failed" and replay.content == got
    _wait_status(two.url, B, "unloaded")


def test_models_sse_reports_load_progress(two):
    HTTP.post(two.url + "/models/unload", json={"model": B}).raise_for_status()
    events: list[tuple[str, dict]] = []
    ready = threading.Event()

    def listen():
        for kind, data in sse_events(two.url + "/models/sse", timeout=60):
            events.append((kind, data))
            if len(events) == 2:
                ready.set()
            if kind == "model" and data["id"] == B and data["status"]["value"] == "loaded":
                return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(10)  # the first frames: every model's row
    assert {d["id"] for k, d in events[:2]} == {A, B} and all(k == "model" for k, _ in events[:2])
    loaded = HTTP.post(two.url + "/models/load", json={"model": "b"}, timeout=120).json()
    assert loaded == {"ok": True, "model": B, "status": {"value": "loaded"}}
    thread.join(30)
    values = [d["status"]["value"] for k, d in events[2:] if k == "model" and d["id"] == B]
    assert values[0] == "loading" and values[-1] == "loaded"
    stages = [d["stage"] for k, d in events if k == "progress" and d["model"] == B]
    assert stages[-1] == "ready" and all(0 <= d["percent"] <= 100 for k, d in events if k == "progress")


def test_lru_eviction_keeps_one_model_loaded(one):
    assert all(r["status"]["value"] == "unloaded" for r in _rows(one.url).values())  # --no-preload
    assert _chat(one.url, A).json()["model"] == A
    assert _chat(one.url, B).json()["model"] == B
    rows = _rows(one.url)
    assert rows[A]["status"]["value"] == "unloaded" and rows[B]["status"]["value"] == "loaded"
    assert _chat(one.url, A).json()["model"] == A
    assert _rows(one.url)[B]["status"]["value"] == "unloaded"


def test_capacity_holds_under_concurrent_loads(one):
    """Simultaneous requests for both models never have two loaded at once:
    every load and unload is watched on /models/sse."""
    active: set[str] = set()
    most = [0]
    stop = threading.Event()

    def watch():
        for kind, row in sse_events(one.url + "/models/sse"):
            if stop.is_set():
                return
            if kind != "model":
                continue
            if row["status"]["value"] in ("loading", "loaded"):
                active.add(row["id"])
            else:
                active.discard(row["id"])
            most[0] = max(most[0], len(active))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(0.5)
    results: list = []
    threads = [threading.Thread(target=lambda m=m: results.append(_chat(one.url, m))) for m in (A, B) * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    assert sorted(r.status_code for r in results) == [200] * 6, (
        [r.text for r in results if r.status_code != 200], one.output()[-3000:])
    assert most[0] == 1


def test_pinned_model_is_not_evicted(one):
    _chat(one.url, A)
    assert HTTP.post(one.url + "/models/pin", json={"model": A, "pinned": True}).json()["pinned"] is True
    refused = _chat(one.url, B)
    assert refused.status_code == 503 and "--models-max" in refused.json()["error"]["message"]
    assert _rows(one.url)[A]["status"]["value"] == "loaded"
    HTTP.post(one.url + "/models/pin", json={"model": A, "pinned": False}).raise_for_status()
    assert _chat(one.url, B).json()["model"] == B


def test_idle_model_unloads(one):
    _chat(one.url, B)
    row = _wait_status(one.url, B, "unloaded", timeout=15)
    assert row["memory_bytes"] is None


def test_default_switches_live(one):
    r = HTTP.post(one.url + "/api/hub/serve", json={"model": "b"}, timeout=120).json()
    assert r["ok"] is True and r["model"] == B and r["status"]["value"] == "loaded"
    assert _chat(one.url, None).json()["model"] == B
    assert HTTP.get(one.url + "/models").json()["default"] == B
    bad = HTTP.post(one.url + "/models/default", json={"model": "nobody/nothing"})
    assert bad.status_code == 400 and HTTP.get(one.url + "/models").json()["default"] == B


@pytest.mark.parametrize("text, where", [
    ("[hearth-test/tiny-a]\nbatchh = 2\n", "models.ini:2: unknown key 'batchh'"),
    ("[hearth-test/tiny-a]\nbatch = 0\n", "models.ini:2: batch: must be at least 1"),
    ("[nobody/nothing]\nbatch = 2\n", "models.ini:1: no model 'nobody/nothing'"),
    ("[hearth-test/tiny-a]\nalias = x\n[hearth-test/tiny-b]\nalias = x\n", "models.ini:3: alias 'x'"),
])
def test_a_bad_preset_stops_start_up_with_file_and_line(library, tmp_path, monkeypatch, text, where):
    from huggingface_hub import constants

    hf, _, _ = library
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf / "hub"))  # the library's cache, in this process
    preset = tmp_path / "models.ini"
    preset.write_text(text)
    assert where in refusal("--models-preset", str(preset), "--default-model", A, "--port", "0")


def test_an_unknown_default_model_stops_start_up(library, monkeypatch):
    """In this process: the refusal is a CommandError from serve's checks before it starts anything, which
    `hearth` prints without a traceback and exits 1 for (tests/e2e/test_cli.py runs that path for real)."""
    from huggingface_hub import constants

    hf, _, _ = library
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf / "hub"))  # the library's cache, in this process
    assert "--default-model: model 'nobody/nothing' not found" in refusal("--default-model", "nobody/nothing",
                                                                            "--port", "0")


def test_router_flags_need_router_mode():
    assert "--models-max is for router mode" in refusal(A, "--models-max", "2")


def test_named_model_from_json_form_and_query():
    """What the router routes by: a JSON body's `model`, a form's (multipart
    bodies are parsed from the bytes that go on unchanged), the query's."""
    import django
    from django.test import RequestFactory

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from serving.routes.proxy import _named_model, routed

    factory = RequestFactory()
    def named(request):
        return _named_model(request)[0]

    assert named(factory.post("/v1/chat/completions", {"model": "m"}, content_type="application/json")) == "m"
    assert _named_model(factory.post("/v1/chat/completions", {"model": "m", "stream": True},
                                     content_type="application/json")) == ("m", True)
    form = factory.post("/v1/audio/transcriptions", {"model": "w", "file": _upload()})
    raw = form.body
    assert named(form) == "w" and form.body == raw
    assert named(factory.get("/fit", {"model": "q"})) == "q"
    assert named(factory.post("/v1/chat/completions", b"{", content_type="application/json")) is None
    assert routed("/v1/chat/completions") and routed("/v1/audio/transcriptions") and routed("/fit")
    assert routed("/api/fit/measure") and routed("/admin/cache/flush") and routed("/signal") and routed("/generate")
    assert not routed("/v1/models") and not routed("/v1/memory/synthesize") and not routed("/api/hub/local")
    assert not routed("/v1/stream/c1") and not routed("/v1/streams/lookup")  # the router records the streams


def _upload():
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("a.wav", b"RIFF\x00\x01binary", content_type="audio/wav")



def test_an_unloaded_model_comes_back_warm_from_the_ssd_tier(two):
    """Unloading writes the model's prompt cache to its SSD tier; the next
    process of that model finds it, so the same conversation is cached."""
    messages = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 12}]
    first = HTTP.post(two.url + "/v1/chat/completions", json={"model": A, "messages": messages, "max_tokens": 2},
                       timeout=120).json()
    HTTP.post(two.url + "/models/unload", json={"model": A}, timeout=120).raise_for_status()
    assert _rows(two.url)[A]["status"]["value"] == "unloaded"
    again = HTTP.post(two.url + "/v1/chat/completions", json={"model": A, "messages": messages, "max_tokens": 2},
                       timeout=120).json()
    prompt = first["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens"] == prompt
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt // 2


def _huge_model(folder) -> None:
    """A model folder whose config describes a KV cache no machine holds
    (the weights file is real, and tiny)."""
    import struct

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 100000,
        "hidden_size": 8192, "num_attention_heads": 64, "vocab_size": 320, "max_position_embeddings": 4096}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")


@pytest.fixture(scope="module")
def bare(library, tmp_path_factory):
    """A router with no --default-model (and no demo model to build), whose --models-dir holds a model
    too big for any machine besides the library's two."""
    hf, hearth, preset = library
    root = tmp_path_factory.mktemp("bare")
    _huge_model(root / "models" / "vendor" / "huge")
    proc = ServerProcess(server_env(hf, hearth), "--models-preset", str(preset), "--models-dir", str(root / "models"),
                         "--no-worker", log_path=root / "router.log").wait_ready()
    yield proc
    assert proc.stop() == 0, proc.output()


def test_a_model_that_cannot_fit_is_refused_before_it_loads(bare):
    rows = _rows(bare.url)
    assert rows["vendor/huge"]["fits"] is False  # named by its path under --models-dir
    refused = _chat(bare.url, "vendor/huge")
    assert refused.status_code == 503
    message = refused.json()["error"]["message"]
    assert "cannot load 'vendor/huge'" in message and "GiB" in message
    assert _rows(bare.url)["vendor/huge"]["pid"] is None  # no process was started for it
    assert _chat(bare.url, B).status_code == 200


def test_a_request_the_client_drops_leaves_its_model_idle(two, library):
    """However a client leaves (before the reply starts, mid-stream), the
    router stops counting it against the model: it can be unloaded again."""
    _chat(two.url, B)
    with pytest.raises(httpx.TimeoutException):  # cut before any reply
        HTTP.post(two.url + "/v1/chat/completions", timeout=0.02, json={
            "model": B, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 400,
            "logit_bias": {str(_eos(library, B)): -100}})
    body = {"model": B, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2000, "stream": True,
            "logit_bias": {str(_eos(library, B)): -100}}
    with httpx.stream("POST", two.url + "/v1/chat/completions", json=body, timeout=60) as r:
        next(r.iter_lines())  # the stream started; leave it
    deadline = time.monotonic() + 30
    while _rows(two.url)[B]["inflight"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _rows(two.url)[B]["inflight"] == 0


def test_resumable_streams_through_the_router(two, library):
    """The router records a resumable stream itself: a dropped client loses
    nothing, a replay follows it, DELETE stops the generation in the model's
    process, and one conversation has one live generation across models."""
    replayed: list[str | None] = []

    def post(model: str, conv: str, max_tokens: int, read: int, events: int = 0) -> bytes:
        body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": max_tokens,
                "stream": True, "temperature": 0, "logit_bias": {str(_eos(library, model)): -100}}
        got = b""
        with httpx.stream("POST", two.url + "/v1/chat/completions", json=body, timeout=120,
                          headers={"X-Conversation-Id": conv}) as r:
            assert r.status_code == 200 and r.headers["x-conversation-id"] == conv
            replayed.append(r.headers.get("x-hearth-replayed"))
            for chunk in r.iter_raw():
                got += chunk
                if len(got) >= read and got.count(b"data: ") >= events:
                    break
        return got

    def lookup(conv: str) -> dict:
        rows = HTTP.post(two.url + "/v1/streams/lookup", json={"conversation_ids": [conv]}).json()["data"]
        return rows[0] if rows else {}

    conv = "router-conv-1"
    first = post(A, conv, 60, 1)
    rest = HTTP.get(f"{two.url}/v1/stream/{conv}", params={"from": len(first)})  # follows until the end
    whole = HTTP.get(f"{two.url}/v1/stream/{conv}").content
    assert first + rest.content == whole and whole.endswith(b"data: [DONE]\n\n")
    assert lookup(conv)["status"] == "done" and lookup(conv)["model"] == A
    usage = json.loads(whole.split(b"data: ")[-2].strip())["usage"]
    assert usage["completion_tokens"] == 60
    assert post(A, conv, 60, 10 << 20) == whole and replayed[-1] == "done"  # an identical retry: replayed

    post(B, conv, 2000, 1)  # the same conversation on the other model
    post(A, conv, 2000, 1)  # stops the generation on B
    post(A, conv, 2000, 1)  # the same request again: an identical retry follows the generation under way
    # And another on the same model: the one before stops, not this one, which has sent a token (its second event).
    post(A, conv, 1999, 1, events=2)
    assert replayed[-4:] == [None, None, "live", None]
    stopped = HTTP.delete(f"{two.url}/v1/stream/{conv}")  # and this one on A
    assert stopped.status_code == 200 and stopped.json()["stopped"] is True
    assert stopped.json()["status"] == "stopped" and stopped.json()["model"] == A
    whole = HTTP.get(f"{two.url}/v1/stream/{conv}").content
    usage = json.loads(whole.split(b"data: ")[-2].strip())["usage"]
    assert 0 < usage["completion_tokens"] < 1999 and whole.endswith(b"data: [DONE]\n\n")
    deadline = time.monotonic() + 30  # neither model is still generating for it
    while any(_rows(two.url)[m]["inflight"] for m in (A, B)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [_rows(two.url)[m]["inflight"] for m in (A, B)] == [0, 0]
    stats = HTTP.get(two.url + "/stats").json()
    assert stats["streams"]["live"] == 0 and stats["streams"]["stored"] >= 1


def test_the_dashboards_remote_turn_puts_streamed_tool_calls_back_together():
    """A model's process streams a call's arguments piece by piece; the
    router's chat turn gets it whole, with the finish reason."""
    from serving.router.remote import RemoteCall, _deltas

    def chunk(delta=None, finish=None, usage=None):
        out = {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
        return {**out, "usage": usage} if usage else out

    calls: dict = {}
    got = []
    for c in (chunk({"reasoning": "Think. "}), chunk({"content": "Sure. "}),
              chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
              chunk(finish="tool_calls", usage={"prompt_tokens": 5, "completion_tokens": 9})):
        got += _deltas(c, calls)
    assert [(d.kind, d.text) for d in got if d.text] == [("reasoning", "Think. "), ("content", "Sure. ")]
    assert [d.calls for d in got if d.calls] == [[RemoteCall("call_1", "get_weather", '{"city": "Paris"}')]]
    assert got[-1].final.finish_reason == "tool_calls" and got[-1].final.usage.completion_tokens == 9


def test_the_dashboards_remote_turn_runs_no_call_the_generation_cut_off():
    """A stream cut inside a call (finish `length` or `stop`) ends with the call's
    arguments as far as they were written: the turn gets no call to run."""
    from serving.router.remote import RemoteCall, _deltas

    def chunk(delta=None, finish=None):
        return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}

    pieces = [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
              {"index": 1, "id": "call_2", "type": "function", "function": {"name": "f", "arguments": '{"a": "x'}}]
    for finish in ("length", "stop"):
        calls: dict = {}
        got = _deltas(chunk({"tool_calls": pieces}), calls) + _deltas(chunk(finish=finish), calls)
        assert [d.calls for d in got if d.calls] == [[RemoteCall("call_1", "f", '{"a": 1}')]]


def test_without_a_default_model_nothing_is_trained_and_a_request_must_name_one(bare, library):
    """No --default-model and no demo model built: the router answers without
    training anything, and a request that names no model is told which it may name."""
    import psutil

    hf, _, _ = library
    health = HTTP.get(bare.url + "/health").json()
    assert health == {"status": "ok"}  # no demo_build: nothing trains
    below = [" ".join(p.cmdline()) for p in psutil.Process(bare.proc.pid).children(recursive=True)]
    assert not any("make-demo-model" in c for c in below), below
    assert not (hf / "hub" / "models--hearth--demo-chat").exists()
    assert HTTP.get(bare.url + "/v1/models").json().get("data") is not None
    assert HTTP.get(bare.url + "/models").json()["default"] is None
    refused = HTTP.post(bare.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert A in error["message"] and B in error["message"] and "no default model" in error["message"]
    named = HTTP.post(bare.url + "/v1/chat/completions",
                      json={"model": B, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert named.status_code == 200 and named.json()["model"] == B, named.text


def test_a_request_naming_no_model_is_told_what_to_name(tiny_model):
    """In this process: with no default model a request that names none gets a 400 that lists the
    library; while the demo model trains towards its first checkpoint, a 503 that says so."""
    from serving.router.catalog import Library
    from serving.router.manager import Manager
    from serving.router.slots import ModelNotFound, RouterError, Settings

    manager = Manager(Library(None, None), Settings(models_max=1), None, 1 << 30)
    with pytest.raises(ModelNotFound) as refused:
        manager.resolve(None)
    assert refused.value.status == 400 and tiny_model in refused.value.message
    manager.no_default_note = "the demo model hearth/demo-chat is training"
    with pytest.raises(RouterError) as waiting:
        manager.resolve("default")
    assert waiting.value.status == 503 and "is training" in waiting.value.message
    assert tiny_model in waiting.value.message


@pytest.mark.parametrize("ended", ["failed", "killed"])
def test_the_demo_model_named_while_it_trains_is_a_503_that_says_so(tiny_model, ended):
    """In this process, through the app: while `make serve` trains the demo model towards its first
    checkpoint, a request that names it (as the README's SDK example does) is a 503 that says it is
    training, in each protocol's shape, as one that names no model is (it was a 400 'model not found');
    POST /models/load of it says the same instead of trying the Hub. A build that failed leaves the
    400 model_not_found, as does one the OOM killer ended (it was "training" until a restart)."""
    import signal

    from hearth.asgi import application
    from hearth.demo_training import DEMO_REPO, DemoTraining
    from serving.router.catalog import Library
    from serving.router.manager import Manager
    from serving.router.slots import Settings
    from tests.inproc import InProcess, kept

    manager = Manager(Library(None, None), Settings(models_max=1), None, 1 << 30)
    training = DemoTraining(manager=manager, chat=True)
    training._expect_chat()  # what starting the build tells the router
    hello = [{"role": "user", "content": "Hello!"}]
    with kept() as runtime:
        runtime.router = manager
        app = InProcess(application)
        for name in (DEMO_REPO, None):
            with pytest.raises(openai.InternalServerError) as waiting:
                app.openai().chat.completions.create(model=name, messages=hello)  # type: ignore[arg-type]
            error = waiting.value.body
            assert waiting.value.status_code == 503 and error["code"] == "model_unavailable", error
            assert f"the demo model {DEMO_REPO} is training" in error["message"]
        with pytest.raises(anthropic.InternalServerError) as waiting_messages:
            app.anthropic().messages.create(model=DEMO_REPO, max_tokens=8, messages=hello)
        assert waiting_messages.value.status_code == 503 and "is training" in waiting_messages.value.message
        loading = app.post("/models/load", json={"model": DEMO_REPO})
        assert loading.status_code == 503 and "is training" in loading.text, loading.text
        assert DEMO_REPO not in manager.fetching

        runtime.demo_build = {"state": "training", "step": 3, "error": "out of memory"}
        training._chat_ended(1 if ended == "failed" else -signal.SIGKILL)
        with pytest.raises(openai.BadRequestError) as gone:
            app.openai().chat.completions.create(model=DEMO_REPO, messages=hello)
        assert gone.value.code == "model_not_found"


def test_a_host_without_a_key_gets_no_authorization_header(tiny_model):
    """In this process: `--models-remote URL` with no `--models-remote-key` forwards with no
    `Authorization` (an empty `Bearer ` failed every forwarded request); a host with a key gets it."""
    from serving.router.catalog import Library
    from serving.router.manager import Manager
    from serving.router.remotes import RemoteHost
    from serving.router.slots import Settings, Slot

    manager = Manager(Library(None, None), Settings(models_max=1), tiny_model, 1 << 30)
    local = manager.slots[tiny_model]
    keyless = Slot(local.entry, status="loaded", remote=RemoteHost("http://127.0.0.1:9", None))
    keyed = Slot(local.entry, status="loaded", remote=RemoteHost("http://127.0.0.1:9", "k"))
    assert "authorization" not in {k.lower() for k in manager.hop_headers(keyless)}
    assert manager.hop_headers(keyed)["authorization"] == "Bearer k"
    assert manager.hop_headers(local)["authorization"] == f"Bearer {manager.key}"  # the children's own key


def _stream_status(url: str, conv: str) -> str | None:
    rows = HTTP.post(url + "/v1/streams/lookup", json={"conversation_ids": [conv]}).json()["data"]
    return rows[0]["status"] if rows else None


def _replay(url: str, conv: str) -> httpx.Response:
    """GET /v1/stream/<conv>, followed to its end, once the router has it (it
    learns that a client left a moment after the client does)."""
    deadline = time.monotonic() + 10
    while (replay := HTTP.get(f"{url}/v1/stream/{conv}")).status_code == 404 and time.monotonic() < deadline:
        time.sleep(0.05)
    return replay


def _leave_stream(url: str, model: str, conv: str, library, path: str = "/v1/chat/completions") -> None:
    """Start a long resumable stream on `model`, read its first bytes, and leave it running."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2000, "stream": True,
            "logit_bias": {str(_eos(library, model)): -100}}
    with httpx.stream("POST", url + path, json=body, timeout=120, headers={"X-Conversation-Id": conv}) as r:
        assert r.status_code == 200
        next(r.iter_raw())


def test_a_refused_post_leaves_the_conversations_stream_running(one, library):
    """A POST on a conversation stops its live stream only once its own stream
    has begun: refused by the router or by the model's process, in any
    protocol, it leaves the stream running. A POST whose model needs the
    room that stream holds (one slot) stops it, and is answered at once."""
    conv = "refused-posts"
    _leave_stream(one.url, A, conv, library)
    followed: list[bytes] = []  # the stream, to its end
    follower = threading.Thread(target=lambda: followed.append(HTTP.get(f"{one.url}/v1/stream/{conv}").content))
    follower.start()
    hi = [{"role": "user", "content": "Hi"}]
    for path, bad, status in [
            ("/v1/chat/completions", {"model": A, "messages": hi, "max_tokens": -1, "stream": True}, 400),
            ("/v1/messages", {"model": A, "messages": [], "max_tokens": 5, "stream": True}, 400),
            ("/v1/responses", {"model": A, "input": "x", "previous_response_id": "resp_nope", "stream": True}, 404),
            ("/v1/chat/completions", {"model": "nobody", "messages": hi, "stream": True}, 400),
            ("/v1/chat/completions", {"model": ["x"], "messages": hi, "stream": True}, 400),
            ("/v1/messages", {"model": {"id": A}, "messages": hi, "max_tokens": 5, "stream": True}, 400)]:
        refused = HTTP.post(one.url + path, json=bad, headers={"X-Conversation-Id": conv})
        assert refused.status_code == status, (path, refused.text)
        assert _stream_status(one.url, conv) == "live", (path, bad)
    started = time.monotonic()
    moved = HTTP.post(one.url + "/v1/chat/completions", headers={"X-Conversation-Id": conv},
                      json={"model": B, "messages": hi, "max_tokens": 2, "stream": True})
    assert moved.status_code == 200 and moved.text.endswith("data: [DONE]\n\n"), moved.text[-300:]
    assert time.monotonic() - started < 60  # not the 2 minutes a load waits for a busy model
    assert _rows(one.url)[A]["status"]["value"] == "unloaded"
    follower.join(60)
    usage = json.loads(followed[0].split(b"data: ")[-2])["usage"]
    assert usage["completion_tokens"] < 2000  # stopped to make room, not waited for


def test_a_stream_whose_client_left_while_its_model_loaded_runs_on(two, library):
    """A resumable POST does not depend on its connection while its model
    loads: the stream is kept, the model loads and generates, a resume gets
    every byte; a load that fails ends the stream with the protocol's error."""
    HTTP.post(two.url + "/models/unload", json={"model": B}).raise_for_status()

    def leave(path: str, conv: str, body: dict) -> None:
        with pytest.raises(httpx.ReadTimeout):  # no answer before the model's process has loaded
            HTTP.post(two.url + path, json={"model": B, "stream": True, **body}, headers={"X-Conversation-Id": conv},
                      timeout=httpx.Timeout(60, read=0.3))

    leave("/v1/chat/completions", "left-while-loading",
          {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 30,
           "logit_bias": {str(_eos(library, B)): -100}})
    whole = _replay(two.url, "left-while-loading")
    assert whole.status_code == 200 and whole.content.endswith(b"data: [DONE]\n\n"), whole.text[-300:]
    assert json.loads(whole.content.split(b"data: ")[-2])["usage"]["completion_tokens"] == 30
    assert _stream_status(two.url, "left-while-loading") == "done"

    HTTP.post(two.url + "/models/unload", json={"model": B}).raise_for_status()
    leave("/v1/messages", "left-a-failed-load", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5})
    os.kill(_wait_status(two.url, B, "loading")["pid"], signal.SIGKILL)  # its process dies while it loads
    failed = _replay(two.url, "left-a-failed-load")
    assert failed.status_code == 200 and failed.headers["x-stream-status"] in ("live", "failed")
    event, data = failed.text.strip().split("\n")
    assert event == "event: error" and "SIGKILL" in json.loads(data[6:])["error"]["message"]
    assert _stream_status(two.url, "left-a-failed-load") == "failed"
    assert _rows(two.url)[B]["inflight"] == 0

    # The conversation has a live stream: a client that leaves during a load that fails leaves it running.
    _leave_stream(two.url, A, "busy-then-left", library)
    HTTP.post(two.url + "/models/unload", json={"model": B}).raise_for_status()
    leave("/v1/messages", "busy-then-left", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5})
    os.kill(_wait_status(two.url, B, "loading")["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _rows(two.url)[B]["status"]["value"] == "loading" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the router has heard of the failed load by now
    assert _stream_status(two.url, "busy-then-left") == "live"
    HTTP.delete(two.url + "/v1/stream/busy-then-left").raise_for_status()


def test_unloading_a_model_while_it_loads_ends_the_load(two):
    """POST /models/unload of a loading model stops its process for good: the
    load and the requests waiting for it get a 503 saying so in their
    protocol. A load alone is no request in flight."""
    HTTP.post(two.url + "/models/unload", json={"model": B}).raise_for_status()
    answers: dict[str, httpx.Response] = {}
    asks = {"load": lambda: HTTP.post(two.url + "/models/load", json={"model": B}),
            "chat": lambda: HTTP.post(two.url + "/v1/messages", json={
                "model": B, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})}
    threads = {name: threading.Thread(target=lambda n=name: answers.__setitem__(n, asks[n]())) for name in asks}
    threads["load"].start()
    row = _wait_status(two.url, B, "loading")
    assert row["inflight"] == 0
    threads["chat"].start()
    deadline = time.monotonic() + 30
    while _rows(two.url)[B]["inflight"] != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    unloaded = HTTP.post(two.url + "/models/unload", json={"model": B})
    assert unloaded.status_code == 200 and unloaded.json()["status"] == {"value": "unloaded"}, unloaded.text
    for thread in threads.values():
        thread.join(60)
    load, chat = answers["load"], answers["chat"]
    assert load.status_code == 503 and load.json()["error"]["code"] == "model_unloaded", load.text
    assert "unloaded (POST /models/unload) while it was loading" in load.json()["error"]["message"]
    assert chat.status_code == 503 and chat.json()["type"] == "error" and "unloaded" in chat.text, chat.text
    time.sleep(1)  # nothing starts it again
    row = _rows(two.url)[B]
    assert row["status"] == {"value": "unloaded"} and row["pid"] is None and row["inflight"] == 0


def test_shutdown_keeps_the_bound_it_announces(library, tmp_path_factory):
    """SIGTERM with a model's process hung (SIGSTOP) mid-stream and no client
    reading: the log counts the stream, and the router is gone within the
    drain and the stop it announces, the hung process killed. (A server of
    its own: its stop is what is tested.)"""
    import psutil

    proc = _router(library, tmp_path_factory, "--models-max", "1", "--drain-seconds", "1", "--flush-seconds", "0")
    child = None
    try:
        child = psutil.Process(_wait_status(proc.url, A, "loaded")["pid"])
        _leave_stream(proc.url, A, "hung-at-shutdown", library)
        deadline = time.monotonic() + 10  # the router sees the client go
        while HTTP.get(proc.url + "/stats").json()["streams"]["following"] and time.monotonic() < deadline:
            time.sleep(0.05)
        child.suspend()
        started = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(60) == 0
        took = time.monotonic() - started
    finally:
        if child is not None and child.is_running():
            child.resume()
        proc.stop()
    said = re.search(r"shutting down: finishing \d+ running request\(s\) and 1 resumable stream\(s\) no client reads, "
                     r"at most (\d+)s; then the models' processes .*? at most (\d+)s", proc.output())
    assert said, proc.output()[-3000:]
    assert took < int(said[1]) + int(said[2]) + 3, (took, said[0])
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
