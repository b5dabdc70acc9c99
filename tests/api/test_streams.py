"""Resumable streams over HTTP (`X-Conversation-Id`, `/v1/stream/{id}`,
`/v1/streams/lookup`): a generation outlives its client, replays from any
byte, follows live, stops on DELETE, and survives a restart; an identical
retry follows the stream it repeats instead of generating again."""
from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

from tests.helpers import ServerProcess, server_env

ASK = [{"role": "user", "content": "Count to a hundred."}]


def _body(tiny_model: str, eos_id: int, max_tokens: int, **extra) -> dict:
    return {"model": tiny_model, "messages": ASK, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "logit_bias": {str(eos_id): -100}, **extra}


def _conv() -> str:
    return f"conv-{uuid.uuid4()}"


def _events(raw: bytes) -> list[dict | str]:
    """The data of each event of an OpenAI stream ([DONE] as a string)."""
    out: list[dict | str] = []
    for block in raw.decode().split("\n\n"):
        data = [line[6:] for line in block.split("\n") if line.startswith("data: ")]
        if data:
            text = "\n".join(data)
            out.append(text if text == "[DONE]" else json.loads(text))
    return out


def _content(raw: bytes) -> tuple[str, str | None, dict | None]:
    """The text, finish reason and usage an OpenAI stream carries."""
    text, finish, usage = "", None, None
    for event in _events(raw):
        if isinstance(event, str):
            continue
        assert "error" not in event, event
        for choice in event.get("choices", []):
            text += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
        usage = event.get("usage") or usage
    return text, finish, usage


def _replay(url: str, conv: str, offset: int = 0, **kwargs) -> httpx.Response:
    return httpx.get(f"{url}/v1/stream/{conv}", params={"from": offset}, timeout=120, **kwargs)


def _lookup(url: str, *ids: str) -> dict:
    reply = httpx.post(url + "/v1/streams/lookup", json={"conversation_ids": list(ids)}, timeout=30)
    assert reply.status_code == 200, reply.text
    return {row["conversation_id"]: row for row in reply.json()["data"]}


def _wait_ended(url: str, conv: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = _lookup(url, conv).get(conv)
        if row is not None and row["status"] != "live":
            return row
        time.sleep(0.1)
    raise AssertionError(f"stream {conv} still live after {timeout}s")


def _start(url: str, body: dict, conv: str, read: int, path: str = "/v1/chat/completions") -> bytes:
    """POST a resumable stream, read about `read` bytes, drop the connection."""
    got = b""
    with httpx.stream("POST", url + path, json=body, headers={"X-Conversation-Id": conv}, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["x-conversation-id"] == conv
        for chunk in reply.iter_raw():
            got += chunk
            if len(got) >= read:
                break
    return got


def test_a_dropped_client_loses_nothing(server, tiny_model, eos_id):
    body = _body(tiny_model, eos_id, 120)
    whole = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).content  # not resumable
    conv = _conv()
    received = _start(server.url, body, conv, 600)
    assert len(received) >= 600 and not received.endswith(b"[DONE]\n\n")
    row = _wait_ended(server.url, conv)
    assert row["status"] == "done" and row["start"] == 0 and row["bytes"] > len(received)
    replay = _replay(server.url, conv)
    assert replay.status_code == 200 and replay.headers["x-stream-status"] == "done"
    assert replay.content.startswith(received)  # the bytes the client saw are the stream's own
    text, finish, usage = _content(replay.content)
    assert (text, finish) == _content(whole)[:2]  # the same answer as a client that stayed
    assert usage["completion_tokens"] == 120  # the generation ran to its end with nobody reading
    assert replay.content.endswith(b"data: [DONE]\n\n")
    # prefix + replay from K is the whole, byte for byte, for any K
    for k in (0, 1, len(received), row["bytes"] // 2, row["bytes"]):
        rest = _replay(server.url, conv, k)
        assert rest.status_code == 200
        assert replay.content[:k] + rest.content == replay.content


def test_a_replay_follows_a_live_generation(server, tiny_model, eos_id):
    conv = _conv()
    first = _start(server.url, _body(tiny_model, eos_id, 1700), conv, 1)
    assert _lookup(server.url, conv)[conv]["status"] == "live"
    followed = _replay(server.url, conv, len(first))  # returns once the stream has ended
    assert followed.headers["x-stream-status"] == "live"
    whole = _replay(server.url, conv).content
    assert first + followed.content == whole
    assert _content(whole)[2]["completion_tokens"] == 1700


def test_delete_stops_the_generation(server, tiny_model, eos_id):
    conv = _conv()
    # 600 bytes: past the role-only first event, so some tokens came before the stop (1 byte let the
    # DELETE land before the first token on a busy machine: 0 completion tokens)
    _start(server.url, _body(tiny_model, eos_id, 1700), conv, 600)
    stopped = httpx.delete(f"{server.url}/v1/stream/{conv}", timeout=30)
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["stopped"] is True and stopped.json()["status"] == "stopped"
    _wait_idle(server.url)  # a decode step under way when the stop came may still land
    generated = _generated(server.url)
    time.sleep(1.0)
    assert _generated(server.url) == generated  # no token decoded after the stop
    raw = _replay(server.url, conv).content
    text, finish, usage = _content(raw)
    assert finish == "stop" and 0 < usage["completion_tokens"] < 1700 and raw.endswith(b"data: [DONE]\n\n")
    again = httpx.delete(f"{server.url}/v1/stream/{conv}", timeout=30)  # idempotent
    assert again.status_code == 200 and again.json()["stopped"] is False
    assert again.json()["bytes"] == len(raw)


def _wait_idle(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engine = httpx.get(url + "/stats", timeout=30).json()["engine"]
        if engine["active"] == 0 and engine["queued"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the engine is still busy")


def _generated(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("hearth_generated_tokens_total"):
            return float(line.split()[-1])
    raise AssertionError("no hearth_generated_tokens_total in /metrics")


def test_a_new_post_on_the_conversation_stops_the_previous_one(server, tiny_model, eos_id):
    conv = _conv()
    _start(server.url, _body(tiny_model, eos_id, 1700), conv, 1)
    second = _start(server.url, _body(tiny_model, eos_id, 5), conv, 10 << 20)  # read to its end
    assert _content(second)[2]["completion_tokens"] == 5
    assert _replay(server.url, conv).content == second  # the conversation's stream is the new one
    assert _lookup(server.url, conv)[conv]["status"] == "done"


def _retry(url: str, body: dict, conv: str, **headers: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120,
                      headers={"X-Conversation-Id": conv, **headers})


def test_an_identical_retry_follows_the_stream_instead_of_generating_again(server, tiny_model, eos_id):
    conv, body = _conv(), _body(tiny_model, eos_id, 1700)
    replays = httpx.get(server.url + "/stats", timeout=30).json()["streams"]["replays"]
    before = _generated(server.url)
    received = _start(server.url, body, conv, 1)  # the client goes away at once
    live = _retry(server.url, body, conv)  # the same request again, while the first still generates
    assert live.status_code == 200 and live.headers["x-hearth-replayed"] == "live"
    assert live.headers["x-conversation-id"] == conv and live.content.startswith(received)
    assert _content(live.content)[2]["completion_tokens"] == 1700
    done = _retry(server.url, body, conv)  # and once more, after it ended
    assert done.headers["x-hearth-replayed"] == "done" and done.content == live.content
    assert done.content == _replay(server.url, conv).content
    assert 1700 <= _generated(server.url) - before < 3400  # one generation for the three requests
    assert httpx.get(server.url + "/stats", timeout=30).json()["streams"]["replays"] == replays + 2

    changed = {**body, "max_tokens": 5}  # another body is another request: it replaces the stream
    fresh = _retry(server.url, changed, conv)
    assert "x-hearth-replayed" not in fresh.headers and _content(fresh.content)[2]["completion_tokens"] == 5
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120,
                      headers={"X-Conversation-Id": conv}) as again:  # the headers say it: 1700 tokens unread
        assert again.status_code == 200 and again.headers.get("x-hearth-replayed") is None  # its stream is gone now
    assert httpx.delete(f"{server.url}/v1/stream/{conv}", timeout=30).status_code == 200  # and stop it


def test_a_stopped_stream_is_generated_again_on_retry(server, tiny_model, eos_id):
    conv, body = _conv(), _body(tiny_model, eos_id, 1700)
    _start(server.url, body, conv, 1)
    assert httpx.delete(f"{server.url}/v1/stream/{conv}", timeout=30).json()["stopped"] is True
    again = _retry(server.url, body, conv)  # what was stopped is not the answer a retry wants
    assert again.status_code == 200 and "x-hearth-replayed" not in again.headers
    assert _content(again.content)[2]["completion_tokens"] == 1700


def test_posts_at_once_on_one_conversation_leave_one_generation(server, tiny_model, eos_id):
    import concurrent.futures

    conv = _conv()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _start(server.url, _body(tiny_model, eos_id, 1700), conv, 1), range(4)))
    assert httpx.get(server.url + "/stats", timeout=30).json()["streams"]["live"] == 1
    assert httpx.delete(f"{server.url}/v1/stream/{conv}", timeout=30).json()["stopped"] is True
    assert httpx.get(server.url + "/stats", timeout=30).json()["streams"]["live"] == 0
    _wait_idle(server.url)  # nothing else is generating for that conversation


def test_lookup_answers_only_for_the_ids_it_is_given(server, tiny_model, eos_id):
    mine, theirs = _conv(), _conv()
    for conv in (mine, theirs):
        _start(server.url, _body(tiny_model, eos_id, 3), conv, 10 << 20)
    found = _lookup(server.url, mine, "conv-never-used")
    assert set(found) == {mine}
    assert found[mine]["status"] == "done" and found[mine]["bytes"] > 0
    assert _lookup(server.url) == {}
    listed = httpx.get(server.url + "/v1/streams", timeout=30)  # there is no listing
    assert listed.status_code in (404, 405) and theirs not in listed.text
    refused = httpx.post(server.url + "/v1/streams/lookup", json={"conversation_ids": "x"}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "conversation_ids"


def test_bad_ids_and_offsets_are_clear_errors(server, tiny_model, eos_id):
    url = server.url
    unknown = _replay(url, "conv-nobody-has")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "stream_not_found"
    assert httpx.delete(f"{url}/v1/stream/conv-nobody-has", timeout=30).status_code == 404
    for bad in ("x" * 300, "a/b", "a b"):
        refused = httpx.post(url + "/v1/chat/completions", json=_body(tiny_model, eos_id, 3),
                             headers={"X-Conversation-Id": bad}, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "X-Conversation-Id", bad
    conv = _conv()
    raw = _start(url, _body(tiny_model, eos_id, 3), conv, 10 << 20)
    _wait_ended(url, conv)
    past = _replay(url, conv, len(raw) + 1)
    assert past.status_code == 416 and str(len(raw)) in past.json()["error"]["message"]
    assert _replay(url, conv, -1).status_code == 400
    assert _replay(url, conv, len(raw)).content == b""
    # without the header a stream is today's: nothing recorded
    plain = httpx.post(url + "/v1/chat/completions", json=_body(tiny_model, eos_id, 3), timeout=30)
    assert plain.status_code == 200 and "x-conversation-id" not in plain.headers


def test_anthropic_and_responses_streams_resume(server, tiny_model, eos_id):
    url = server.url
    conv = _conv()
    body = {"model": tiny_model, "max_tokens": 30, "messages": ASK, "stream": True}
    with httpx.stream("POST", url + "/v1/messages", json=body, headers={"X-Conversation-Id": conv},
                      timeout=60) as reply:
        assert reply.status_code == 200
        next(reply.iter_raw())
    _wait_ended(url, conv)
    raw = _replay(url, conv).content.decode()
    assert raw.startswith("event: message_start") and raw.endswith("event: message_stop\ndata: "
                                                                   '{"type": "message_stop"}\n\n')
    conv = _conv()
    body = {"model": tiny_model, "max_output_tokens": 30, "input": "hello", "stream": True}
    with httpx.stream("POST", url + "/v1/responses", json=body, headers={"X-Conversation-Id": conv},
                      timeout=60) as reply:
        assert reply.status_code == 200
        next(reply.iter_raw())
    _wait_ended(url, conv)
    events = _events(_replay(url, conv).content)
    ended = [e for e in events if isinstance(e, dict) and e.get("type") in ("response.completed",
                                                                            "response.incomplete")]
    assert ended, events[-3:]
    response = ended[0]["response"]
    stored = httpx.get(f"{url}/v1/responses/{response['id']}", timeout=30)  # stored with nobody reading
    assert stored.status_code == 200 and stored.json()["status"] == response["status"]


def _records(folder) -> dict:
    """The stream records on disk, by conversation id (the size of the bytes written as `end`)."""
    out = {}
    for path in folder.glob("*.json"):
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now
        data = path.with_suffix(".sse")
        meta["end"] = data.stat().st_size if data.exists() else 0
        out[meta["conversation_id"]] = meta
    return out


@pytest.fixture
def own_server(homes, tiny_model, tmp_path):
    """A server with a home of its own, restarted by the test."""
    home = tmp_path / "home"
    started: list[ServerProcess] = []

    def start() -> ServerProcess:
        proc = ServerProcess(server_env(homes[0], home), tiny_model, "--no-worker",
                             log_path=tmp_path / f"serve{len(started)}.log")
        started.append(proc)
        return proc.wait_ready()

    start.home = home  # type: ignore[attr-defined]
    yield start
    for proc in started:
        proc.stop()


def test_streams_survive_a_restart(own_server, tiny_model, eos_id):
    first = own_server()
    done, cut = _conv(), _conv()
    _start(first.url, _body(tiny_model, eos_id, 50), done, 1)
    _wait_ended(first.url, done)
    whole = _replay(first.url, done).content
    received = _start(first.url, _body(tiny_model, eos_id, 1700), cut, 2000)  # running when the server dies
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # both on disk by now (written behind, at most 0.25 s late)
        records = _records(own_server.home / "streams")
        # all the client was sent, not just the first (role-only) chunk, so text is on disk before the kill
        if records.get(done, {}).get("state") == "done" and records.get(cut, {}).get("end", 0) >= len(received):
            break
        time.sleep(0.01)
    assert _lookup(first.url, cut)[cut]["status"] == "live"
    fresh = _conv()  # begun just before the server dies: nothing of it written behind yet
    _start(first.url, {"model": tiny_model, "input": "hello", "max_output_tokens": 1700, "stream": True,
                       "logit_bias": {str(eos_id): -100}}, fresh, 1, "/v1/responses")
    first.proc.kill()
    first.proc.wait()
    second = own_server()
    assert _replay(second.url, done).content == whole  # finished while nobody read: still there
    row = _lookup(second.url, cut)[cut]
    assert row["status"] == "interrupted"
    raw = _replay(second.url, cut).content  # ends, with an error event that says why
    events = _events(raw)
    assert "server stopped before this generation ended" in events[-1]["error"]["message"]
    assert len(_content(raw.rsplit(b"\n\n", 2)[0] + b"\n\n")[0]) > 0  # the text before the crash is kept
    # a client that got more than the disk did: its replay is the event that says why the stream ended
    tail = _replay(second.url, cut, len(received))
    assert tail.status_code == 200 and "server stopped before" in _events(tail.content)[-1]["error"]["message"]
    assert _replay(second.url, cut, row["bytes"]).content == b""  # from its end: nothing more
    assert _lookup(second.url, fresh)[fresh]["status"] == "interrupted"
    events = _events(_replay(second.url, fresh).content)  # its error event numbered after what was kept
    assert events[-1]["type"] == "error" and "server stopped before" in events[-1]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    stats = httpx.get(second.url + "/stats", timeout=30).json()["streams"]
    assert stats["stored"] == 3 and stats["live"] == 0 and stats["durable"] is True
