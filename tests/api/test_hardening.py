"""One request cannot hurt another (the hardening issue), on the session's
real server: values the samplers cannot run are refused in each protocol's
shape while a neighbour's stream finishes intact; hostile JSON (NaN,
1e999, deep nesting) is a 400 on every JSON route; odd field types are
never a 500; the chat socket survives binary, empty and nested frames and
never stores or sends a NaN; a chat of any size opens, in pages."""
from __future__ import annotations

import asyncio
import json
import sqlite3
import threading

import httpx
import pytest
import websockets

CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}
DEEP = b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"


def _ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/ws/chat"


class _Neighbour(threading.Thread):
    """A long greedy stream that runs while the attacks are sent."""

    def __init__(self, base_url: str, eos_id: int):
        super().__init__(daemon=True)
        self.url, self.body = base_url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "List three colors."}], "max_tokens": 80, "temperature": 0,
            "logit_bias": {str(eos_id): -100}, "stream": True}
        self.text, self.finish, self.errors, self.started = "", None, [], threading.Event()

    def run(self):
        with httpx.stream("POST", self.url, json=self.body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    self.errors.append(chunk["error"])
                    continue
                choice = chunk["choices"][0]
                self.text += choice["delta"].get("content") or ""
                self.finish = choice["finish_reason"] or self.finish
                if self.text:
                    self.started.set()


ATTACKS = [  # (field, value, param): each passed JSON parsing and failed inside the batched step before
    ("top_k", 320, "top_k"), ("top_k", 10**6, "top_k"),
    ("temperature", 1e308 * 10, "temperature"),  # sent as 1e999-like text below
    ("xtc_threshold", 0.7, "xtc_threshold"),
    ("seed", -1, "seed"), ("seed", 2**64, "seed"),
    ("logit_bias", {str(i): -1000 for i in range(320)}, "logit_bias"),
    ("repetition_context_size", 2**31, "repetition_context_size"),
    ("presence_penalty", 1e6, "presence_penalty"),
]


def _raw(body: dict) -> bytes:
    """JSON as a hostile client writes it: Python's encoder spells inf as Infinity."""
    return json.dumps(body).encode()


def test_values_the_samplers_cannot_run_are_refused_and_the_neighbour_finishes(base_url, eos_id):
    alone = _Neighbour(base_url, eos_id)
    alone.run()
    assert alone.finish == "length" and not alone.errors
    neighbour = _Neighbour(base_url, eos_id)
    neighbour.start()
    assert neighbour.started.wait(60)
    for field, value, param in ATTACKS:
        extra = {"temperature": 1.0} if field != "temperature" else {}
        body = {**CHAT, **extra, field: value}
        r = httpx.post(base_url + "/v1/chat/completions", content=_raw(body), timeout=30)
        assert r.status_code == 400, (field, r.text)
        err = r.json()["error"]
        if field == "temperature":  # Infinity never parses
            assert err["message"] == "invalid JSON body: Infinity is not a JSON number"
        else:
            assert err["param"] == param and err["type"] == "invalid_request_error", err
        completion = httpx.post(base_url + "/v1/completions", content=_raw({"prompt": "a", **extra, field: value}))
        assert completion.status_code == 400, (field, completion.text)
        messages = httpx.post(base_url + "/v1/messages", content=_raw({**CHAT, **extra, field: value}))
        if field != "logit_bias":  # not part of the Messages protocol, refused there anyway
            assert messages.status_code == 400 and messages.json()["type"] == "error", (field, messages.text)
        responses = httpx.post(base_url + "/v1/responses", content=_raw({"input": "hi", **extra, field: value}))
        assert responses.status_code == 400, (field, responses.text)
    neighbour.join(120)
    assert not neighbour.errors and neighbour.finish == "length"
    assert neighbour.text == alone.text
    stats = httpx.get(base_url + "/stats").json()
    assert stats["engine"]["failed_steps"] == 0 and stats["engine"]["failed_rows"] == 0


@pytest.mark.parametrize("raw", [b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
                                 b'{"messages": [{"role": "user", "content": "hi"}], "top_p": 1e999}',
                                 b'{"messages": [{"role": "user", "content": "hi"}], "min_p": -Infinity}'])
def test_json_that_is_not_json_is_refused(inproc, raw):
    r = inproc.post("/v1/chat/completions", content=raw)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("invalid JSON body: ")


def test_the_edges_of_the_ranges_are_served(base_url):
    for extra in ({"seed": 2**64 - 1, "temperature": 1.0}, {"top_k": 319, "temperature": 1.0},
                  {"repetition_penalty": 1.2, "repetition_context_size": 2**31 - 1}, {"logit_bias": {"5": -100}}):
        r = httpx.post(base_url + "/v1/chat/completions", json={**CHAT, **extra}, timeout=60)
        assert r.status_code == 200, (extra, r.text)


JSON_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
               "/v1/responses", "/v1/embeddings", "/v1/adapters", "/api/quantize/submit", "/api/finetune/submit",
               "/api/dataset/submit", "/api/hub/download", "/api/sessions/import", "/api/memory/init",
               "/admin/cache/session/close"]


@pytest.mark.parametrize("path", JSON_ROUTES)
def test_deeply_nested_json_is_a_400_on_every_json_route(inproc, path):
    r = inproc.post(path, content=DEEP, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    body = r.json()
    message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body.get("error")
    assert "nested more than 64 levels" in message, body


ODD = [None, True, -1, 2**70, 1.5, "x", "", [], [1, "a"], {}, {"a": {"b": []}}]
FIELDS = {
    "/v1/chat/completions": (CHAT, ["messages", "model", "max_tokens", "temperature", "top_p", "top_k", "stop",
                                    "tools", "tool_choice", "response_format", "logprobs", "top_logprobs", "seed",
                                    "logit_bias", "chat_template_kwargs", "reasoning_effort", "adapter", "n",
                                    "stream_options", "parallel_tool_calls", "guided_choice", "session_id"]),
    "/v1/completions": ({"prompt": "a", "max_tokens": 2}, ["prompt", "max_tokens", "stop", "echo", "seed",
                                                           "guided_regex", "xtc_probability", "min_p"]),
    "/v1/messages": ({**CHAT, "max_tokens": 2}, ["messages", "system", "max_tokens", "tools", "tool_choice",
                                                 "stop_sequences", "thinking", "metadata", "top_k"]),
    "/v1/responses": ({"input": "hi", "max_output_tokens": 2}, ["input", "instructions", "tools", "tool_choice",
                                                                "text", "reasoning", "previous_response_id",
                                                                "store", "max_output_tokens"]),
    "/v1/embeddings": ({"input": "hi"}, ["input", "encoding_format", "instruction"]),
}


@pytest.mark.parametrize("path", list(FIELDS))
def test_odd_values_in_any_field_are_never_a_500(inproc, path):
    base, fields = FIELDS[path]
    odd_messages = [[{"role": ["user"], "content": "hi"}], [{"role": "user", "content": {"x": 1}}],
                    [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}], ["hi"], [[]]]
    for field in fields:
        values = ODD + (odd_messages if field in ("messages", "input") else [])
        for value in values:
            r = inproc.post(path, json={**base, field: value})
            assert r.status_code < 500, (path, field, value, r.text)


def test_a_session_with_a_stored_nan_opens_and_its_settings_are_json(server, homes):
    async def run():
        async with websockets.connect(_ws_url(server.url)) as ws:
            await _until(ws, "sessions")
            await ws.send(json.dumps({"type": "new_session"}))
            history = await _until(ws, "history")
            return history["sessionId"]

    session = asyncio.run(run())
    db = sqlite3.connect(homes[1] / "hearth.sqlite3")
    with db:
        db.execute("UPDATE chat_chatsession SET sampling_json = ? WHERE id = ?",
                   ('{"temperature": NaN, "top_p": 0.9}', session))
    db.close()

    async def reopen():
        async with websockets.connect(_ws_url(server.url)) as ws:
            await _until(ws, "sessions")
            await ws.send(json.dumps({"type": "open_session", "path": session}))
            raw = await _until(ws, "history", raw=True)
            assert "NaN" not in raw
            settings = json.loads(raw)["settings"]
            assert settings["sampling"] == {"top_p": 0.9}
            for bad in ({"temperature": 1e308 * 10}, {"top_k": 10**6}, {"xtc_threshold": 0.9}, {"seed": -5}):
                await ws.send(json.dumps({"type": "set_sampling", "scope": "session", **bad}))
                error = await _until(ws, "error")
                assert list(bad)[0] in error["message"] or "JSON" in error["message"], error
            await ws.send(json.dumps({"type": "set_sampling", "scope": "session", "temperature": 0.5}))
            await ws.send(json.dumps({"type": "open_session", "path": session}))
            return json.loads(await _until(ws, "history", raw=True))["settings"]["sampling"]

    assert asyncio.run(reopen()) == {"top_p": 0.9, "temperature": 0.5}


async def _until(ws, kind: str, raw: bool = False, timeout: float = 30):
    while True:
        text = await asyncio.wait_for(ws.recv(), timeout)
        frame = json.loads(text)
        if frame.get("type") == kind:
            return text if raw else frame


def test_binary_empty_and_nested_frames_get_an_error_and_the_socket_stays(server):
    async def run():
        async with websockets.connect(_ws_url(server.url)) as ws:
            await _until(ws, "sessions")
            for frame in (b"\x00\x01binary", "", "[" * 3000 + "]" * 3000, '{"type": "prompt", "text": NaN}', "{"):
                await ws.send(frame)
                error = await _until(ws, "error")
                assert error["message"], frame
            await ws.send(json.dumps({"type": "list_sessions"}))
            return await _until(ws, "sessions")

    assert asyncio.run(run())["type"] == "sessions"


def test_a_chat_of_any_size_opens_in_pages(server):
    big = "lorem ipsum dolor sit amet ✓ " * 60_000  # 1.7 MB of text in one entry, over the socket's 1 MiB
    rounds = [{"text": "", "calls": [{"id": f"c{n}", "tool": "write", "args": {"path": "a.txt", "content": "z" * size},
                                      "ok": True, "result": "written"} for n, size in enumerate((10, 1_500_000, 20))]},
              {"text": "", "calls": [{"id": "c9", "tool": "read", "args": {"path": "a.txt"}, "ok": True,
                                      "result": "y" * 20_000}]}]
    entries = [{"type": "session", "title": "huge", "leaf": "e9"}]
    parent = None
    for i in range(10):
        role = "user" if i % 2 == 0 else "assistant"
        content = big if i == 5 else f"message {i} " + "x" * 150_000
        entries.append({"type": "message", "id": f"e{i}", "parentId": parent,
                        "message": {"role": role, "content": content, "reasoning": "why " * 30_000 if i == 5 else ""},
                        "meta": {"toolRounds": rounds} if i == 7 else {}})
        parent = f"e{i}"
    r = httpx.post(server.url + "/api/sessions/import", json={"entries": entries}, timeout=60)
    assert r.status_code == 200, r.text
    path = r.json()["path"]

    async def run():
        async with websockets.connect(_ws_url(server.url), max_size=None) as ws:
            await _until(ws, "sessions")
            await ws.send(json.dumps({"type": "open_session", "path": path}))
            frames = [await _until(ws, "history", raw=True)]
            while json.loads(frames[-1]).get("more"):
                frames.append(await _until(ws, "history_more", raw=True))
            return frames

    frames = asyncio.run(run())
    assert len(frames) > 3 and max(len(f.encode()) for f in frames) < 512 << 10
    rows: list[dict] = []
    for frame in frames:
        for item in json.loads(frame)["items"]:
            if not item.get("continued"):
                rows.append(item)
                continue
            row = rows[-1]
            assert row["id"] == item["id"]
            row["content"] += item.get("content", "")
            row["reasoning"] += item.get("reasoning", "")
            row["meta"].setdefault("toolRounds", []).extend(item.get("meta", {}).get("toolRounds", []))
            for call in item.get("meta", {}).get("roundCalls", []):
                row["meta"]["toolRounds"][-1]["calls"].append(call)
    assert json.loads(frames[0])["total"] == len(rows) == 10
    assert rows[5]["content"] == big and rows[5]["reasoning"] == "why " * 30_000
    shown = rows[7]["meta"]["toolRounds"]
    assert [[c["id"] for c in r["calls"]] for r in shown] == [["c0", "c1", "c2"], ["c9"]]
    assert shown[0]["calls"][0] == rounds[0]["calls"][0] and shown[1] == rounds[1]
    assert "more characters, kept in the chat but not shown here" in shown[0]["calls"][1]["args"]
    assert [r["content"][:10] for r in rows if r is not rows[5]] == [f"message {i} "[:10] for i in range(10) if i != 5]


@pytest.mark.parametrize("extra,param", [
    ({"guided_choice": [f"c{i}" for i in range(1025)]}, "guided_choice"),
    ({"guided_regex": "a" * 70_000}, "guided_regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": json.loads(
        '{"type": "object", "properties": {"a": ' * 20 + '{"type": "string"}' + "}}" * 20)}}},
     "response_format.json_schema.schema"),
])
def test_grammars_over_the_caps_are_refused_before_compiling(base_url, extra, param):
    r = httpx.post(base_url + "/v1/chat/completions", json={**CHAT, **extra}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "grammar_too_large", err


def test_the_degrade_warning_names_the_reason_without_source_paths(base_url):
    schema = {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}
    r = httpx.post(base_url + "/v1/chat/completions", json={**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}, timeout=30)
    assert r.status_code == 200
    warning = r.headers["warning"]
    assert warning.startswith("grammar not enforced: ") and "missing" in warning
    assert ".cc:" not in warning and "/project/" not in warning, warning
    grammar = httpx.get(base_url + "/stats").json()["grammar"]
    assert grammar["max_bytes"] == 256 << 20 and grammar["failures"] >= 1


@pytest.mark.parametrize("head,message,needle", [
    ({"title": 5}, {}, "the session's title must be text or null"),
    ({"systemPrompt": ["be brief"]}, {}, "the session's systemPrompt must be text or null"),
    ({}, {"reasoning": {"steps": 1}}, "entries[1].message.reasoning must be text or null")])
def test_an_import_with_a_field_of_the_wrong_type_is_a_400_naming_it(inproc, head, message, needle):
    """Stored as it came, such a value came back from the export as its Python repr ("{'steps': 1}")."""
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    entries = [{"type": "session", **head},
               {"type": "message", "id": "a", "message": {"role": "user", "content": "hi", **message}}]
    r = inproc.post("/api/sessions/import", json={"entries": entries})
    assert r.status_code == 400 and r.json() == {"ok": False, "error": needle}
    fine = inproc.post("/api/sessions/import", json={"entries": [
        {"type": "session", "title": None, "systemPrompt": "be brief"},
        {"type": "message", "id": "a", "message": {"role": "user", "content": "hi", "reasoning": None}}]})
    assert fine.status_code == 200 and fine.json()["title"] == "Imported chat"
