"""Raw HTTP: SSE framing byte by byte, discovery routes, and every error shape (the
refusals in process: they need the routes and an engine, not a server)."""
import json

import httpx
import openai
import pytest

CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6}


def sse_events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"\n\n"), raw[-40:]
    events = raw[:-2].split(b"\n\n")
    for e in events:
        assert e.startswith(b"data: ") and b"\n" not in e, e
    return [e[len(b"data: "):] for e in events]


def test_chat_sse_framing(base_url):
    with httpx.stream("POST", base_url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw())
    data = sse_events(raw)
    assert data[-1] == b"[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    middle = chunks[1:-1]
    assert middle and all(set(c["choices"][0]["delta"]) == {"content"} for c in middle)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length" and last["choices"][0]["delta"] == {}
    assert last["usage"]["completion_tokens"] == 6
    assert "usage" not in chunks[-2]


def test_completion_sse_framing(base_url):
    body = {"prompt": "The", "max_tokens": 4, "stream": True}
    raw = httpx.post(base_url + "/v1/completions", json=body).content
    data = sse_events(raw)
    assert data[-1] == b"[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["total_tokens"] == chunks[-1]["usage"]["prompt_tokens"] + 4


def test_health_is_byte_exact(base_url):
    r = httpx.get(base_url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_models_lists_served_model_first(base_url, tiny_model):
    data = httpx.get(base_url + "/v1/models").json()
    assert data["object"] == "list"
    served = data["data"][0]
    assert served["id"] == tiny_model and served["object"] == "model" and served["owned_by"] == "hearth"
    assert served["context_window"] == 2048
    assert served["gen_defaults"] == {"temperature": 0.0, "top_p": None, "top_k": 5}
    assert served["capabilities"]["chat_completions"] is True
    one = httpx.get(f"{base_url}/v1/models/{tiny_model}").json()
    assert one == served  # the model object, as the list has it
    assert openai.OpenAI(base_url=base_url + "/v1", api_key="x").models.retrieve(tiny_model).id == tiny_model
    missing = httpx.get(base_url + "/v1/models/nobody/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert missing.json()["error"]["param"] == "model" and "nobody/nothing" in missing.json()["error"]["message"]


def test_api_index(base_url, tiny_model):
    for path in ("/v1", "/v1/"):
        body = httpx.get(base_url + path).json()
        assert body["name"] == "hearth" and body["model"] == tiny_model
        assert "POST /v1/chat/completions" in body["endpoints"]


def test_unmatched_paths_are_json_404_in_their_surface_s_shape(base_url):
    openai_shape = {"error": {"message": "not found", "type": "invalid_request_error", "param": None,
                              "code": "not_found"}}
    for path in ("/nope", "/v1/nope", "/v1/chat"):
        r = httpx.get(base_url + path)
        assert r.status_code == 404 and r.json() == openai_shape
    r = httpx.get(base_url + "/v1/messages/nope")
    assert r.status_code == 404 and r.json() == {"type": "error", "error": {"type": "not_found_error",
                                                                            "message": "not found"}}
    r = httpx.get(base_url + "/api/nope")
    assert r.status_code == 404 and r.json() == {"ok": False, "error": "not found"}


def test_wrong_method_is_json(base_url):
    r = httpx.get(base_url + "/v1/chat/completions")
    assert r.status_code == 405
    assert "not allowed" in r.json()["error"]["message"]
    r = httpx.get(base_url + "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error" and "not allowed" in r.json()["error"]["message"]
    r = httpx.put(base_url + "/api/jobs")
    assert r.status_code == 405 and r.json()["ok"] is False and "not allowed" in r.json()["error"]


def _error(inproc, path, content):
    """The refusal of a body, in process (`inproc`): the status and the OpenAI error object."""
    r = inproc.post(path, content=content if isinstance(content, bytes) else json.dumps(content),
                    headers={"content-type": "application/json"})
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return r.status_code, body["error"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"\xff\xfe"])
def test_invalid_json_body(inproc, path, raw):
    status, err = _error(inproc, path, raw)
    assert status == 400 and err["message"].startswith("invalid JSON body")


@pytest.mark.parametrize("body", [{}, {"messages": []}, {"messages": None}, {"messages": "hi"}])
def test_messages_required(inproc, body):
    assert _error(inproc, "/v1/chat/completions", body) == (
        400, {"message": "messages required", "type": "invalid_request_error", "param": "messages", "code": None})


@pytest.mark.parametrize("body,message", [
    ({}, "prompt required"),
    ({"prompt": ""}, "prompt must not be empty"),
    ({"prompt": [1, 2, 3]}, "prompt must be a string (token arrays are not accepted)"),
    ({"prompt": 42}, "prompt must be a string (token arrays are not accepted)"),
])
def test_completion_prompt_errors(inproc, body, message):
    status, err = _error(inproc, "/v1/completions", body)
    assert (status, err["message"], err["param"]) == (400, message, "prompt")


BAD_FIELDS = [
    ("temperature", -0.1), ("temperature", 2.5), ("temperature", "hot"), ("top_p", 1.5), ("top_p", -1),
    ("top_k", -1), ("top_k", 1.5), ("min_p", 2), ("max_tokens", 0), ("max_tokens", -5), ("max_tokens", "ten"),
    ("max_completion_tokens", 0), ("seed", "abc"), ("seed", 1.5), ("stream", "yes"), ("n", 9), ("n", 0),
    ("stop", 5), ("stop", ["a", "b", "c", "d", "e"]), ("stop", [1]), ("logit_bias", {"x": 1}),
    ("logit_bias", {"1": "high"}), ("logit_bias", [1, 2]), ("chat_template_kwargs", "x"),
]


@pytest.mark.parametrize("field,value", BAD_FIELDS)
def test_out_of_range_fields_name_the_field(inproc, field, value):
    status, err = _error(inproc, "/v1/chat/completions", {**CHAT, field: value})
    assert status == 400 and err["param"] == field and field in err["message"], err


@pytest.mark.parametrize("field,value", [f for f in BAD_FIELDS if f[0] != "chat_template_kwargs"])
def test_completion_fields_checked_too(inproc, field, value):
    status, err = _error(inproc, "/v1/completions", {"prompt": "a", field: value})
    assert status == 400 and err["param"] == field


def test_logit_bias_message_is_mlx_lm_exact(inproc):
    _, err = _error(inproc, "/v1/chat/completions", {**CHAT, "logit_bias": {"x": 1}})
    assert err["message"] == "logit_bias must be a dict of int to float"


def test_logit_bias_token_outside_vocab(inproc):
    status, err = _error(inproc, "/v1/chat/completions", {**CHAT, "logit_bias": {"99999999": 1}})
    assert status == 400 and err["param"] == "logit_bias" and "99999999" in err["message"]


def test_bad_message_shapes(inproc):
    status, err = _error(inproc, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]})
    assert status == 400 and err["param"] == "messages[0].role"
    status, err = _error(inproc, "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]})
    assert status == 400 and err["param"] == "messages[0]"
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    status, err = _error(inproc, "/v1/chat/completions", {"messages": [{"role": "user", "content": [image]}]})
    assert status == 400 and err["message"] == "model has no vision sidecar"


def test_admin_login_page_and_its_static_files(base_url):
    page = httpx.get(base_url + "/admin/login/")
    assert page.status_code == 200 and "Django administration" in page.text
    css = httpx.get(base_url + "/static/admin/css/base.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]


def test_database_is_sqlite_in_wal_mode(server, homes):
    import sqlite3

    db = homes[1] / "hearth.sqlite3"
    assert db.exists()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "auth_user" in tables  # serve applied the migrations
