"""The /ws/chat frame protocol with Channels' WebsocketCommunicator against
the real engine on the tiny model: a turn, abort, regenerate and edit as
sibling branches, switching siblings, fork, session listing and deletion,
and the session search/export routes over what the turns stored."""
from __future__ import annotations

import asyncio

from channels.testing import WebsocketCommunicator

from tests.chat import chatws


def _active(frames: list[dict]) -> str:
    return [f for f in frames if f["type"] == "sessions"][-1]["activePath"]


def test_a_turn_streams_and_is_stored(engine):
    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "set_sampling", "temperature": 0, "scope": "session"})
        frames = await chatws.turn(ws, {"type": "prompt", "text": "hello there"})
        kinds = [f["type"] for f in frames]
        assert kinds[0] == "turn_start" and "text_delta" in kinds and "turn_end" in kinds and "context" in kinds
        end = next(f for f in frames if f["type"] == "turn_end")
        assert end["lane"] in ("batched", "serial") and end["completion_tokens"] > 0
        context = next(f for f in frames if f["type"] == "context")
        assert context["tokens"] > 0 and context["contextWindow"]
        sessions = [f for f in frames if f["type"] == "sessions"][-1]
        assert frames[-1]["type"] == "turn_end" and sessions["activePath"]
        assert sessions["items"][0]["title"] == "hello there"
        text = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
        await ws.send_json_to({"type": "open_session", "path": sessions["activePath"]})
        history = await ws.receive_json_from(timeout=10)
        assert [i["role"] for i in history["items"]] == ["user", "assistant"]
        assert history["items"][1]["content"] == text and history["items"][1]["meta"]["lane"] == end["lane"]
        await ws.disconnect()

    asyncio.run(run())


def test_a_turn_outlives_its_socket_and_is_stored(engine):
    """A socket that closes mid-turn leaves the turn running: it ends, is
    stored, and the next socket on the chat finds it (and, while it runs, the
    session's stream is live for the sidebar's lookup)."""
    from chat import live
    from hearth.root import RUNTIME

    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "set_sampling", "temperature": 0, "scope": "session"})
        await ws.send_json_to({"type": "prompt", "text": "tell me a long story " * 5})
        start = await ws.receive_json_from(timeout=10)
        assert start["type"] == "turn_start"
        session = start["sessionId"]
        while (await ws.receive_json_from(timeout=30))["type"] != "text_delta":
            pass
        await ws.disconnect()
        assert (await RUNTIME.streams.lookup([session]))[0]["status"] in ("live", "done")
        for _ in range(600):
            if live.live(RUNTIME, session) is None:
                break
            await asyncio.sleep(0.05)
        assert (await RUNTIME.streams.lookup([session]))[0]["status"] == "done"
        ws = await chatws.connect()
        await ws.send_json_to({"type": "open_session", "path": session})
        history = await ws.receive_json_from(timeout=10)
        assert [i["role"] for i in history["items"]] == ["user", "assistant"]
        answer = history["items"][1]
        assert answer["content"] and answer["meta"]["aborted"] is False and answer["meta"]["completion_tokens"] > 0
        assert (await ws.receive_json_from(timeout=10))["type"] == "sessions"
        await ws.disconnect()

    asyncio.run(run())


def test_set_sampling_takes_every_sampling_field_the_http_routes_take(engine):
    """The socket reads the one list of sampling fields (`params.SAMPLING`), context windows included."""
    from inference.protocols.params import SAMPLING

    values = {"temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "xtc_probability": 0.1,
              "xtc_threshold": 0.2, "seed": 7, "repetition_penalty": 1.1, "repetition_context_size": 16,
              "presence_penalty": 0.2, "presence_context_size": 32, "frequency_penalty": 0.1,
              "frequency_context_size": 24}
    assert set(values) == set(SAMPLING)

    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "new_session"})
        history = await ws.receive_json_from(timeout=10)
        await ws.send_json_to({"type": "set_sampling", "scope": "session", **values})
        await ws.send_json_to({"type": "open_session", "path": history["sessionId"]})
        while (frame := await ws.receive_json_from(timeout=10))["type"] != "history":
            assert frame["type"] != "error", frame
        await ws.disconnect()
        return frame["settings"]["sampling"]

    assert asyncio.run(run()) == values


def test_regenerate_edit_and_switch_make_sibling_branches(engine):
    async def run():
        ws = await chatws.connect()
        await chatws.turn(ws, {"type": "prompt", "text": "first question"})
        frames = await chatws.turn(ws, {"type": "regenerate"})
        siblings = next(f for f in frames if f["type"] == "siblings")
        assert siblings["count"] == 2 and siblings["index"] == 1
        first_answer = siblings["siblingIds"][0]
        frames = await chatws.turn(ws, {"type": "edit_resend", "text": "a better question"})
        await ws.send_json_to({"type": "open_session", "path": _active(frames)})
        history = (await ws.receive_json_from(timeout=10))["items"]
        assert history[0]["content"] == "a better question" and history[0]["siblingCount"] == 2
        await ws.receive_json_from()  # sessions
        await ws.send_json_to({"type": "switch_sibling", "entryId": history[0]["id"]})
        assert (await ws.receive_json_from())["type"] == "history"
        assert (await ws.receive_json_from())["index"] == 1
        await ws.send_json_to({"type": "switch_sibling", "entryId": first_answer})
        history = (await ws.receive_json_from(timeout=10))["items"]
        assert history[0]["content"] == "first question" and history[1]["id"] == first_answer
        assert (await ws.receive_json_from())["index"] == 0
        await ws.send_json_to({"type": "switch_sibling", "entryId": "nope"})
        assert (await ws.receive_json_from())["type"] == "error"
        await ws.disconnect()

    asyncio.run(run())


def test_every_turn_start_names_its_question_so_a_page_drops_the_branch_it_replaces(engine):
    """A regenerated turn's turn_start names the question already shown (the old reply goes), an edited one
    the new question with the parent it shares with the one it replaces."""
    async def run():
        ws = await chatws.connect()
        frames = await chatws.turn(ws, {"type": "prompt", "text": "first question"})
        start = next(f for f in frames if f["type"] == "turn_start")
        asked = start["user"]
        assert asked["id"] == start["userEntryId"] and asked["content"] == "first question"
        assert asked["role"] == "user" and asked["parentId"] is None
        frames = await chatws.turn(ws, {"type": "regenerate"})
        again = next(f for f in frames if f["type"] == "turn_start")["user"]
        assert again["id"] == asked["id"]
        frames = await chatws.turn(ws, {"type": "edit_resend", "text": "a better question", "entryId": asked["id"]})
        edited = next(f for f in frames if f["type"] == "turn_start")["user"]
        assert edited["content"] == "a better question" and edited["id"] != asked["id"]
        assert edited["parentId"] is None and edited["siblingCount"] == 2 and edited["siblingIndex"] == 1
        await ws.disconnect()

    asyncio.run(run())


def test_abort_keeps_what_was_shown_and_frees_the_engine(engine):
    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "set_sampling", "scope": "next_turn", "temperature": 1.0})
        await ws.send_json_to({"type": "prompt", "text": "tell me a long story " * 5})
        assert (await ws.receive_json_from(timeout=10))["type"] == "turn_start"
        while (await ws.receive_json_from(timeout=30))["type"] != "text_delta":
            pass
        await ws.send_json_to({"type": "abort"})
        frames = []
        while not frames or frames[-1]["type"] != "turn_end":
            frames.append(await ws.receive_json_from(timeout=30))
        assert frames[-1]["aborted"] is True
        for _ in range(50):
            if engine.active_rows == 0:
                break
            await asyncio.sleep(0.05)
        assert engine.active_rows == 0
        await ws.disconnect()

    asyncio.run(run())


def test_sessions_fork_delete_and_refusals(engine):
    async def run():
        ws = await chatws.connect()
        frames = await chatws.turn(ws, {"type": "prompt", "text": "zebra crossing facts"})
        original = _active(frames)
        await ws.send_json_to({"type": "fork_session", "path": original})
        history = await ws.receive_json_from(timeout=10)
        assert history["sessionId"] != original and [i["role"] for i in history["items"]] == ["user", "assistant"]
        listed = await ws.receive_json_from()
        assert {original, history["sessionId"]} <= {s["path"] for s in listed["items"]}
        await ws.send_json_to({"type": "delete_session", "path": history["sessionId"]})
        assert (await ws.receive_json_from())["items"] == []  # the open session went away
        listed = await ws.receive_json_from()
        assert history["sessionId"] not in {s["path"] for s in listed["items"]}
        for bad in ({"type": "open_session", "path": "missing"}, {"type": "prompt", "text": ""},
                    {"type": "set_sampling", "temperature": "hot"}, {"type": "what"}, {"type": "regenerate"}):
            await ws.send_json_to(bad)
            assert (await ws.receive_json_from())["type"] == "error", bad
        await ws.send_to(text_data="not json")
        assert (await ws.receive_json_from())["type"] == "error"

        # A question whose turn failed is not followed by another question: the next one is its sibling.
        await ws.send_json_to({"type": "new_session"})
        await ws.receive_json_from(timeout=10)
        await ws.receive_json_from()
        await ws.send_json_to({"type": "set_adapter", "id": "ghost"})
        frames = await chatws.turn(ws, {"type": "prompt", "text": "first try"})
        assert any(f["type"] == "error" and "ghost" in f["message"] for f in frames)
        await ws.send_json_to({"type": "set_adapter", "id": None})
        frames = await chatws.turn(ws, {"type": "prompt", "text": "second try"})
        await ws.send_json_to({"type": "open_session", "path": _active(frames)})
        history = await ws.receive_json_from(timeout=10)
        assert [i["role"] for i in history["items"]] == ["user", "assistant"]
        assert history["items"][0]["content"] == "second try" and history["items"][0]["siblingCount"] == 2
        assert history["settings"]["adapter"] is None and history["settings"]["thinking"] is False
        await ws.receive_json_from()
        await ws.disconnect()

        foreign = WebsocketCommunicator(chatws.asgi_app(), "/ws/chat",
                                        headers=[(b"host", b"testserver"), (b"origin", b"http://evil.example")])
        connected, _ = await foreign.connect()  # accepted, then closed with the reason's code
        assert connected and await foreign.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}

    asyncio.run(run())


def test_search_and_export_read_the_stored_sessions(engine, client):
    async def run():
        ws = await chatws.connect()
        await chatws.turn(ws, {"type": "prompt", "text": "Tell me about Rosemary and thyme in a stew"})
        # A session of its own: the random model's first answer may fill the context window.
        await ws.send_json_to({"type": "new_session"})
        await ws.receive_json_from(timeout=10)  # history
        await ws.receive_json_from()  # sessions
        await chatws.turn(ws, {"type": "prompt", "text": "So viel ÄRGER im Büro"})
        await ws.disconnect()

    asyncio.run(run())
    found = client.get("/api/sessions/search", {"q": "rosemary"}).json()
    assert found["ok"] and found["results"]
    match = found["results"][0]["matches"][0]
    start, end = match["ranges"][0]
    assert match["snippet"][start:end].lower() == "rosemary" and match["role"] == "user"
    assert client.get("/api/sessions/search").status_code == 400
    umlaut = client.get("/api/sessions/search", {"q": "ärger"}).json()["results"][0]["matches"][0]
    start, end = umlaut["ranges"][0]
    assert umlaut["snippet"][start:end] == "ÄRGER"  # case folded beyond ASCII, offsets on the original
    path = found["results"][0]["session_path"]
    exported = client.get("/api/sessions/export", {"path": path}).json()
    assert exported["ok"] and exported["entries"][0]["type"] == "session"
    assert [e["message"]["role"] for e in exported["entries"][1:]] == ["user", "assistant"]
    jsonl = client.get("/api/sessions/export", {"path": path, "format": "jsonl"})
    assert jsonl["content-type"] == "application/x-ndjson" and len(jsonl.content.splitlines()) == 3
    assert client.get("/api/sessions/export", {"path": "nope"}).status_code == 404
    assert client.get("/api/sessions/export").status_code == 400
    assert client.get("/ws/chat").status_code == 426


def test_a_refused_turn_keeps_why_and_regenerate_tries_again(engine):
    """A question the model cannot take (here, longer than its context) is not
    left unanswered with no word: the turn is stored with its error, which the
    page shows where the answer would be; the error is no message the model
    reads later, and regenerate makes a sibling of it."""
    from chat import store, toolloop
    from chat.models import ChatEntry
    from chat.window import conversation

    async def run():
        ws = await chatws.connect()
        frames = await chatws.turn(ws, {"type": "prompt", "text": "word " * 5000})
        error = next(f for f in frames if f["type"] == "error")
        assert "maximum context length" in error["message"]
        assert error["message"].endswith("does not fit even alone (with the system prompt and this turn's tool "
                                         "results): make it shorter.")  # the chat's own way to shorten its prompt
        path = _active(frames)
        await ws.send_json_to({"type": "open_session", "path": path})
        history = (await ws.receive_json_from(timeout=10))["items"]
        assert [i["role"] for i in history] == ["user", "assistant"]
        assert history[1]["content"] == "" and history[1]["meta"]["error"] == error["message"]
        assert history[1]["meta"]["aborted"] is True
        await ws.receive_json_from()  # sessions
        frames = await chatws.turn(ws, {"type": "regenerate"})
        assert next(f for f in frames if f["type"] == "siblings")["count"] == 2
        await ws.disconnect()
        return history

    history = asyncio.run(run())
    refused = ChatEntry.objects.get(id=history[1]["id"])
    assert toolloop.replay(refused) == [{"role": "assistant", "content": ""}]  # its error is not the model's
    session = refused.session
    session.leaf = refused
    session.save(update_fields=["leaf"])
    follow_up = store.ask(session, "and now?")  # after an answer that is only an error: its question's sibling
    assert follow_up.parent_id == refused.parent.parent_id
    assert [m["role"] for m in conversation(session, follow_up).messages()] == ["user"]
    queued = store.add(session, refused, "user", "one queued behind it")  # as a turn's queue stores it
    assert [(m["role"], m["content"]) for m in conversation(session, queued).messages()][1:] == [
        ("assistant", ""), ("user", "one queued behind it")]
