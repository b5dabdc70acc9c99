"""Two `hearth serve` web nodes on one PostgreSQL and one Redis, as behind a
load balancer: each has a HEARTH_HOME of its own (nothing passes through a
shared folder), so what one node's socket or stream finds of the other's
work came through the database and Redis. A dashboard session whose turn
runs on node A is opened on node B mid-turn, queued on and stopped from
there; a resumable stream made on A replays and stops on B; a node that
dies mid-stream has its stream ended, with its crash event, by the other."""
from __future__ import annotations

import contextlib
import json
import signal
import time
import uuid

import httpx
import pytest
from websockets.sync.client import connect

from tests.helpers import ServerProcess, server_env

pytestmark = pytest.mark.slow  # `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)

LONG = 4000  # tokens: a turn that is still running whatever the machine's speed, until it is stopped


@pytest.fixture(scope="module")
def nodes(postgres, redis_url, homes, tiny_model, tmp_path_factory):
    database = postgres.create_database("webnodes")
    shared_redis = redis_url.rsplit("/", 1)[0] + "/5"  # a database of its own on the session's Redis
    logs = tmp_path_factory.mktemp("web-node-logs")

    def env(name: str) -> dict:
        return dict(server_env(homes[0], tmp_path_factory.mktemp(f"home-{name}")), DATABASE_URL=database,
                    HEARTH_REDIS_URL=shared_redis)
    a = ServerProcess(env("a"), tiny_model, "--no-worker", log_path=logs / "a.log").wait_ready()
    b = ServerProcess(env("b"), tiny_model, "--no-worker", log_path=logs / "b.log").wait_ready()  # a migrated
    try:
        yield {"a": a, "b": b, "env": env, "logs": logs, "tiny_model": tiny_model}
    finally:
        codes = a.stop(), b.stop()
        assert codes == (0, 0), a.output() + b.output()


@contextlib.contextmanager
def _ws(node: ServerProcess):
    with connect(node.url.replace("http", "ws") + "/ws/chat", open_timeout=30) as ws:
        assert [json.loads(ws.recv(timeout=30))["type"] for _ in range(2)] == ["ready", "sessions"]
        yield ws


def _until(ws, kind: str, seen: list | None = None, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        frame = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if seen is not None:
            seen.append(frame)
        assert frame["type"] != "error", frame
        if frame["type"] == kind:
            return frame


def _long_turn(ws, eos_id: int, text: str) -> str:
    ws.send(json.dumps({"type": "set_sampling", "scope": "session", "temperature": 0, "max_tokens": LONG,
                        "logit_bias": {str(eos_id): -100}}))
    ws.send(json.dumps({"type": "prompt", "text": text}))
    session = _until(ws, "turn_start")["sessionId"]
    _until(ws, "text_delta")
    return session


def test_a_session_moves_to_the_other_node_mid_turn(nodes, eos_id):
    a, b = nodes["a"], nodes["b"]
    with _ws(a) as ws:
        session = _long_turn(ws, eos_id, "Tell me a very long story")
    # The connection dropped; the reconnect lands on node B.
    seen: list[dict] = []
    with _ws(b) as ws:
        ws.send(json.dumps({"type": "open_session", "path": session}))
        history = _until(ws, "history")
        assert [i["role"] for i in history["items"]] == ["user"]  # the answer is still being written, on A
        assert _until(ws, "turn_start", seen)["sessionId"] == session  # A's turn, replayed from its first frame
        _until(ws, "text_delta", seen)
        # Typed on B, queued on A's turn: the queue comes back through the stream.
        ws.send(json.dumps({"type": "prompt", "text": "and then?", "streamingBehavior": "followUp"}))
        assert _until(ws, "queue_update", seen)["followUp"] == ["and then?"]
        ws.send(json.dumps({"type": "abort"}))  # stopped from B: A stops it, the queued text comes back
        dropped = _until(ws, "queue_update", seen)
        assert dropped["dropped"] == ["and then?"] and dropped["followUp"] == []
        end = _until(ws, "turn_end", seen)
        assert end["aborted"] is True and not end.get("continues")

    with _ws(a) as ws:  # and back on A: the stopped turn is stored, with what it wrote
        ws.send(json.dumps({"type": "open_session", "path": session}))
        items = _until(ws, "history")["items"]
    assert [i["role"] for i in items] == ["user", "assistant"]
    shown = "".join(f["delta"] for f in seen if f["type"] == "text_delta")
    assert items[1]["meta"]["aborted"] is True and shown and items[1]["content"][:20] == shown[:20]


def test_a_follow_up_typed_on_the_other_node_is_answered_after_the_turn(nodes, eos_id):
    a, b = nodes["a"], nodes["b"]
    with _ws(a) as ws_a, _ws(b) as ws_b:
        ws_a.send(json.dumps({"type": "set_sampling", "scope": "session", "temperature": 0, "max_tokens": 400,
                              "logit_bias": {str(eos_id): -100}}))
        ws_a.send(json.dumps({"type": "prompt", "text": "Count to a hundred"}))
        session = _until(ws_a, "turn_start")["sessionId"]
        ws_b.send(json.dumps({"type": "open_session", "path": session}))
        _until(ws_b, "turn_start")
        ws_b.send(json.dumps({"type": "prompt", "text": "Now backwards", "streamingBehavior": "followUp"}))
        seen: list[dict] = []
        first_end = _until(ws_b, "turn_end", seen, timeout=120)
        assert first_end["continues"] is True and first_end["entry"]["role"] == "assistant"
        follow_up = _until(ws_b, "turn_start", seen)
        assert follow_up["user"]["content"] == "Now backwards"
        last = _until(ws_b, "turn_end", seen, timeout=120)
        assert not last.get("continues") and last["aborted"] is False
        # A's socket saw the same turn: the same stored answer, then the same follow-up and its answer.
        assert _until(ws_a, "turn_end")["entry"]["id"] == first_end["entry"]["id"]
        assert _until(ws_a, "turn_start")["user"]["id"] == follow_up["user"]["id"]
        assert _until(ws_a, "turn_end") == last
        ws_b.send(json.dumps({"type": "open_session", "path": session}))
        items = _until(ws_b, "history")["items"]
    assert [(i["role"], i["content"] if i["role"] == "user" else "") for i in items] == [
        ("user", "Count to a hundred"), ("assistant", ""), ("user", "Now backwards"), ("assistant", "")]


def _post_stream(node: ServerProcess, conversation: str, max_tokens: int, eos_id: int) -> bytes:
    """Start a resumable generation on `node`, read its first bytes and drop the connection."""
    body = {"model": "tiny", "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "logit_bias": {str(eos_id): -100}, "messages": [{"role": "user", "content": "go on"}]}
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"X-Conversation-Id": conversation}) as reply:
        assert reply.status_code == 200
        return next(reply.iter_bytes())


def test_a_resumable_stream_replays_and_stops_on_the_other_node(nodes, eos_id):
    a, b = nodes["a"], nodes["b"]
    done = f"conv-{uuid.uuid4()}"
    first = _post_stream(a, done, 24, eos_id)
    replay = httpx.get(f"{b.url}/v1/stream/{done}", timeout=60)  # follows A's stream live to its end
    assert replay.status_code == 200 and replay.content.startswith(first)
    assert replay.content.rstrip().endswith(b"data: [DONE]")
    assert replay.content == httpx.get(f"{a.url}/v1/stream/{done}", timeout=60).content  # byte for byte
    middle = len(replay.content) // 2
    tail = httpx.get(f"{b.url}/v1/stream/{done}", params={"from": middle}, timeout=60)
    assert tail.content == replay.content[middle:] and tail.headers["x-stream-status"] == "done"

    running = f"conv-{uuid.uuid4()}"
    _post_stream(a, running, LONG, eos_id)
    rows = httpx.post(f"{b.url}/v1/streams/lookup", json={"conversation_ids": [done, running, "nobody"]}).json()
    assert {r["conversation_id"]: r["status"] for r in rows["data"]} == {done: "done", running: "live"}
    stopped = httpx.delete(f"{b.url}/v1/stream/{running}", timeout=30).json()  # stopped on A, asked on B
    assert stopped["stopped"] is True and stopped["status"] == "stopped"
    assert httpx.get(f"{a.url}/v1/stream/{running}").headers["x-stream-status"] == "stopped"
    assert httpx.delete(f"{b.url}/v1/stream/{running}", timeout=30).json()["stopped"] is False


def test_a_node_that_dies_mid_stream_has_it_ended_by_another(nodes, eos_id):
    b = nodes["b"]
    c = ServerProcess(nodes["env"]("c"), nodes["tiny_model"], "--no-worker", log_path=nodes["logs"] / "c.log")
    c.wait_ready()
    conversation = f"conv-{uuid.uuid4()}"
    try:
        _post_stream(c, conversation, LONG, eos_id)
        rows = httpx.post(f"{b.url}/v1/streams/lookup", json={"conversation_ids": [conversation]}).json()["data"]
        assert rows[0]["status"] == "live"
    finally:
        c.proc.send_signal(signal.SIGKILL)
        c.proc.wait()
        c.stop()
    replay = httpx.get(f"{b.url}/v1/stream/{conversation}", timeout=60)  # once C's heartbeat lapses
    assert replay.status_code == 200
    assert b"the server stopped before this generation ended" in replay.content
    assert httpx.post(f"{b.url}/v1/streams/lookup", json={"conversation_ids": [conversation]}
                      ).json()["data"][0]["status"] == "interrupted"
