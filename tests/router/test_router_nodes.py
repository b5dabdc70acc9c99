"""Router-mode web nodes on one Redis: which node serves each model is
shared (serving/router/owners.py). Two routers with libraries and homes
of their own (standing in for two machines behind one port) and the same
API key: a model loaded on A is served by A for a client of B, and B
starts no process for it; a model only A's library has is listed by B and
served through it; a model A unloads is loaded by the next node asked; a
node killed while it serves a model hands it over to the next request.
With two keys, a Response or a stream one key made through either node is
not the other key's (the holder travels with each hop)."""
from __future__ import annotations

import signal
import time

import httpx
import openai
import pytest
import redis

from tests.helpers import ServerProcess, build_tiny_model, server_env

pytestmark = pytest.mark.slow  # `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)

SHARED, ONLY_A = "hearth-test/tiny-shared", "hearth-test/tiny-only-a"
KEY = "cluster-key-0123456789abcdef"
OTHER = "cluster-key-two-0123456789ab"  # a second user's key: what KEY makes is not OTHER's
HTTP = httpx.Client(timeout=120, headers={"authorization": f"Bearer {KEY}"})


@pytest.fixture(scope="module")
def nodes(redis_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("router-nodes")
    build_tiny_model(root / "a-hf" / "hub", SHARED)
    build_tiny_model(root / "a-hf" / "hub", ONLY_A)
    build_tiny_model(root / "b-hf" / "hub", SHARED)
    shared_redis = redis_url.rsplit("/", 1)[0] + "/6"  # a database of its own on the session's Redis
    redis.Redis.from_url(shared_redis).flushdb()

    def start(name: str) -> ServerProcess:
        env = dict(server_env(root / f"{name}-hf", root / f"{name}-hearth"), HEARTH_REDIS_URL=shared_redis)
        return ServerProcess(env, "--default-model", SHARED, "--no-preload", "--no-worker", "--api-key", KEY,
                             "--api-key", OTHER, log_path=root / f"{name}.log")
    a, b = start("a"), start("b")
    a.wait_ready(), b.wait_ready()
    try:
        yield {"a": a, "b": b, "redis": shared_redis}
    finally:
        a.stop(), b.stop()


def _rows(node: ServerProcess) -> dict:
    return {r["id"]: r for r in HTTP.get(node.url + "/models").json()["data"]}


def _ask(node: ServerProcess, model: str, **headers) -> httpx.Response:
    reply = HTTP.post(node.url + "/v1/chat/completions", headers=headers,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    return reply


def _until(check, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"never: {what}")


def test_a_model_loaded_on_one_node_is_served_there_for_the_other(nodes):
    a, b = nodes["a"], nodes["b"]
    _ask(a, SHARED)
    row_a = _rows(a)[SHARED]
    assert row_a["status"]["value"] == "loaded" and row_a["pid"] and row_a["served_by"] is None

    client = openai.OpenAI(base_url=b.url + "/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model=SHARED, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")
    pieces = list(client.chat.completions.create(model=SHARED, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, stream=True))
    assert pieces[-1].choices[0].finish_reason in ("stop", "length")
    row_b = _rows(b)[SHARED]  # B started no process of its own: A answered
    assert row_b["status"]["value"] == "unloaded" and row_b["pid"] is None
    assert row_b["served_by"]["url"] == a.url
    assert _rows(a)[SHARED]["status"]["value"] == "loaded"

    # A model only A's library has, once loaded there, is listed by B and served through it.
    assert ONLY_A not in _rows(b)
    _ask(a, ONLY_A)
    remote = _until(lambda: _rows(b).get(ONLY_A), f"{ONLY_A} listed by B")
    assert remote["status"]["value"] == "loaded" and remote["remote"]["url"] == a.url
    assert remote["remote"]["node"] and remote["pid"] is None
    assert "hearth-test/tiny-only-a" in {m.id for m in client.models.list()}
    assert client.chat.completions.create(model=ONLY_A, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4).choices

    # The hop's mark counts only with the cluster's hop key: with a client's key B still passes it to A...
    _ask(b, SHARED, **{"x-hearth-hop": "1"})
    assert _rows(b)[SHARED]["status"]["value"] == "unloaded"
    # ...and a request another node passed on (the hop key) is served where it lands, never passed on again.
    hop_key = redis.Redis.from_url(nodes["redis"]).get("hearth:router:hop-key").decode()
    _ask(b, SHARED, **{"x-hearth-hop": "1", "authorization": f"Bearer {hop_key}"})
    assert _rows(b)[SHARED]["status"]["value"] == "loaded"
    assert HTTP.post(b.url + "/models/unload", json={"model": SHARED}).status_code == 200
    assert HTTP.get(b.url + "/stats").status_code == 200  # a fan-out never asks another node (no loop)


def test_what_one_key_makes_through_a_node_is_not_another_keys(nodes):
    """B passes the request to A's model process (A has it loaded): the
    holder goes with both hops, so the Response A's process stores and the
    stream B records are KEY's alone, on either node."""
    a, b = nodes["a"], nodes["b"]
    other = {"authorization": f"Bearer {OTHER}"}
    _ask(a, SHARED)
    made = HTTP.post(b.url + "/v1/responses", json={"model": SHARED, "input": "hi", "max_output_tokens": 4})
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    assert HTTP.get(a.url + f"/v1/responses/{rid}").json()["id"] == rid
    assert HTTP.get(a.url + f"/v1/responses/{rid}", headers=other).status_code == 404
    follow = HTTP.post(a.url + "/v1/responses", headers=other,
                       json={"model": SHARED, "input": "more", "max_output_tokens": 4, "previous_response_id": rid})
    assert follow.status_code == 404, follow.text

    streamed = HTTP.post(b.url + "/v1/chat/completions", headers={"x-conversation-id": "nodes-scope"},
                         json={"model": SHARED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                               "stream": True})
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert HTTP.get(a.url + "/v1/stream/nodes-scope").text == streamed.text  # through Redis
    assert HTTP.get(a.url + "/v1/stream/nodes-scope", headers=other).status_code == 404
    taken = HTTP.post(a.url + "/v1/chat/completions", headers={**other, "x-conversation-id": "nodes-scope"},
                      json={"model": SHARED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                            "stream": True})
    assert taken.status_code == 409, taken.text


def test_a_model_one_node_unloads_is_loaded_by_the_next_node_asked(nodes):
    a, b = nodes["a"], nodes["b"]
    _ask(a, SHARED)  # A serves it (it loaded it first, or B let it go)
    assert _rows(a)[SHARED]["status"]["value"] == "loaded"
    assert HTTP.post(a.url + "/models/unload", json={"model": SHARED}).status_code == 200
    assert _rows(a)[SHARED]["status"]["value"] == "unloaded"
    _ask(b, SHARED)
    row_b = _rows(b)[SHARED]
    assert row_b["status"]["value"] == "loaded" and row_b["pid"]
    assert _rows(a)[SHARED]["status"]["value"] == "unloaded"  # B did not pass it back to A
    _until(lambda: (_rows(a)[SHARED]["served_by"] or {}).get("url") == b.url, "A shows B serving it", 15)
    _ask(a, SHARED)
    assert _rows(a)[SHARED]["status"]["value"] == "unloaded"  # A passed it to B


def test_a_node_killed_while_it_serves_a_model_hands_it_over(nodes):
    a, b = nodes["a"], nodes["b"]
    _ask(b, SHARED)
    assert _rows(b)[SHARED]["status"]["value"] == "loaded"
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait()
    # Its record in Redis lives on for a few seconds; the first request finds it gone and loads here.
    _ask(a, SHARED)
    row_a = _rows(a)[SHARED]
    assert row_a["status"]["value"] == "loaded" and row_a["pid"] and row_a["served_by"] is None
