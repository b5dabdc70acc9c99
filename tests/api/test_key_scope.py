"""With several API keys, what one key makes and can fetch again by id (a
resumable stream, a stored Response and its items) is that key's: another key is
answered as if it did not exist, cannot stop or replace it, and cannot
claim it by stating its holder; only a hop key (the router's, in its model
processes) may state a request's holder. In process, with the keys set on
the runtime; tests/router/test_router_nodes.py holds it through two router
nodes and their model processes."""
from __future__ import annotations

import pytest

A, B, HOP = "key-a-0123456789abcdef", "key-b-0123456789abcdef", "key-hop-0123456789abcd"
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


def _as(key: str, **extra) -> dict:
    return {"authorization": f"Bearer {key}", **extra}


@pytest.fixture
def two_keys(inproc):
    from hearth.root import RUNTIME

    before = RUNTIME.api_keys, RUNTIME.hop_keys
    RUNTIME.api_keys, RUNTIME.hop_keys = frozenset({A, B, HOP}), frozenset({HOP})
    try:
        yield inproc
    finally:
        RUNTIME.api_keys, RUNTIME.hop_keys = before


def _holder(key: str) -> str:
    from core.holders import holder_of
    from hearth.access import digest

    return holder_of(digest(key))


def test_a_stream_is_its_keys(two_keys):
    app = two_keys
    made = app.post("/v1/chat/completions", json={**CHAT, "stream": True},
                    headers=_as(A, **{"x-conversation-id": "scope-one"}))
    assert made.status_code == 200 and "[DONE]" in made.text
    assert app.get("/v1/stream/scope-one", headers=_as(A)).text == made.text

    assert app.get("/v1/stream/scope-one", headers=_as(B)).status_code == 404
    assert app.post("/v1/streams/lookup", json={"conversation_ids": ["scope-one"]}, headers=_as(B)).json()["data"] == []
    assert app.request("DELETE", "/v1/stream/scope-one", headers=_as(B)).status_code == 404
    taken = app.post("/v1/chat/completions", json={**CHAT, "stream": True},
                     headers=_as(B, **{"x-conversation-id": "scope-one"}))
    assert taken.status_code == 409 and taken.json()["error"]["param"] == "X-Conversation-Id"
    # Stating A's holder takes nothing without a hop key; with one, it is A's request.
    spoof = _as(B, **{"x-hearth-holder": _holder(A)})
    assert app.get("/v1/stream/scope-one", headers=spoof).status_code == 404
    assert app.get("/v1/stream/scope-one", headers=_as(HOP, **{"x-hearth-holder": _holder(A)})).text == made.text

    # A's is untouched by all that.
    found = app.post("/v1/streams/lookup", json={"conversation_ids": ["scope-one"]}, headers=_as(A)).json()["data"]
    assert [s["status"] for s in found] == ["done"]
    assert app.request("DELETE", "/v1/stream/scope-one", headers=_as(A)).status_code == 200


def test_a_stored_response_is_its_keys(two_keys):
    app = two_keys
    made = app.post("/v1/responses", json={"input": "Hello", "max_output_tokens": 4}, headers=_as(A))
    assert made.status_code == 200, made.text
    rid = made.json()["id"]

    assert app.get(f"/v1/responses/{rid}", headers=_as(B)).status_code == 404
    assert app.request("DELETE", f"/v1/responses/{rid}", headers=_as(B)).status_code == 404
    follow = app.post("/v1/responses", json={"input": "Again", "max_output_tokens": 4, "previous_response_id": rid},
                      headers=_as(B))
    assert follow.status_code == 404 and follow.json()["error"]["code"] == "response_not_found"
    assert app.get(f"/v1/responses/{rid}", headers=_as(B, **{"x-hearth-holder": _holder(A)})).status_code == 404
    # its items too: listed, or taken by an item_reference, by A alone
    assert app.get(f"/v1/responses/{rid}/input_items", headers=_as(B)).status_code == 404
    (asked,) = app.get(f"/v1/responses/{rid}/input_items", headers=_as(A)).json()["data"]
    for item_id in (asked["id"], made.json()["output"][0]["id"]):
        refer = {"input": [{"type": "item_reference", "id": item_id}], "max_output_tokens": 4}
        other = app.post("/v1/responses", json=refer, headers=_as(B))
        assert other.status_code == 404 and other.json()["error"]["code"] == "item_not_found", other.text
        # B sending an item of its own under that id makes it B's to find, and leaves A's found by A
        own = {"type": "message", "role": "user", "content": "B's own", "id": item_id}
        assert app.post("/v1/responses", json={"input": [own], "max_output_tokens": 1},
                        headers=_as(B)).status_code == 200
        assert app.post("/v1/responses", json=refer, headers=_as(B)).status_code == 200
        taken = app.post("/v1/responses", json=refer, headers=_as(A))
        assert taken.status_code == 200, taken.text
        (took,) = app.get(f"/v1/responses/{taken.json()['id']}/input_items", headers=_as(A)).json()["data"]
        assert took["id"] == item_id and "B's own" not in str(took)

    assert app.get(f"/v1/responses/{rid}", headers=_as(A)).json()["id"] == rid
    follow = app.post("/v1/responses", json={"input": "Again", "max_output_tokens": 4, "previous_response_id": rid},
                      headers=_as(A))
    assert follow.status_code == 200, follow.text
    assert app.request("DELETE", f"/v1/responses/{rid}", headers=_as(A)).status_code == 200
