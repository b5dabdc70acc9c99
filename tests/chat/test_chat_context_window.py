"""A dashboard chat that outgrows the model's context (`--max-context 512`,
the demo model's window) goes on: each turn sends the system prompt, the
new message and the newest earlier turns that leave its reply its room
(chat/window.py), the stored conversation stays whole, and the turn's
meta says how many messages the model no longer saw and where its view
begins (`context_cut`), which the page marks. A message too long even
alone is refused, as before."""
from __future__ import annotations

import asyncio

from tests.chat import chatws

WINDOW = 512
BUDGET = WINDOW // 4  # the chat's reply cap (test_chat_reply_budget.py)
# About 135 tokens each: three earlier turns and the new one fill more than the window.
CHARS = 520  # --max-prompt-chars: one question and its answer, not three questions
QUESTION = "Tell me about the {0} river and the towns along its banks, " * 3


def test_a_conversation_past_the_context_sends_its_newest_turns(served, django_ready):
    served("--no-worker", "--max-context", str(WINDOW))

    async def run():
        ws = await chatws.connect(headers=[(b"host", b"127.0.0.1")])
        session = await chatws.new_session(ws)
        await ws.send_json_to({"type": "set_system_prompt", "text": "You are a terse geographer."})
        for n in range(6):
            frames = await chatws.turn(ws, {"type": "prompt", "text": QUESTION.format(n)})
            errors = [f for f in frames if f["type"] == "error"]
            assert not errors, (n, errors)  # the old chat: refused from the 4th turn on (prompt >= 512)
        items = await chatws.history(ws, session)
        await ws.disconnect()
        return items

    items = asyncio.run(run())
    assert [i["role"] for i in items] == ["user", "assistant"] * 6  # the stored history is whole
    replies = [i["meta"] for i in items if i["role"] == "assistant"]
    assert all(meta["prompt_tokens"] <= WINDOW - BUDGET for meta in replies)  # its reply had its room
    cut = replies[-1]["context_cut"]
    ids = [i["id"] for i in items]
    assert items[ids.index(cut["first_seen"])]["role"] == "user"  # whole turns: the view begins at a question
    assert cut["hidden"] == ids.index(cut["first_seen"]) >= 2  # the messages before it, none of them seen
    assert "context_cut" not in replies[0]


def test_a_message_too_long_alone_is_refused(served, django_ready):
    served("--no-worker", "--max-context", str(WINDOW))

    async def run():
        ws = await chatws.connect(headers=[(b"host", b"127.0.0.1")])
        await chatws.new_session(ws)
        await chatws.turn(ws, {"type": "prompt", "text": "Hello!"})
        frames = await chatws.turn(ws, {"type": "prompt", "text": QUESTION.format("long") * 5})
        await ws.disconnect()
        return frames

    frames = asyncio.run(run())
    error = next(f for f in frames if f["type"] == "error")
    assert "does not fit even alone" in error["message"] and "512" in error["message"]


def test_a_router_counts_a_prompt_as_the_models_process_does(served, django_ready, tiny_model):
    """Router mode counts with the template and tokenizer of the folder the model's process serves
    (`window.router_count`): the count the process itself makes of the same turn."""
    served("--no-worker", "--max-context", str(WINDOW))
    from chat import window
    from chat.models import ChatSession
    from chat.turns import prepare
    from hearth.root import RUNTIME
    from hub.registry import snapshot

    session = ChatSession(system_prompt="You are a terse geographer.", thinking=False)
    messages = [{"role": "system", "content": "You are a terse geographer."},
                {"role": "user", "content": QUESTION.format(1)}, {"role": "assistant", "content": "Rivers."},
                {"role": "user", "content": QUESTION.format(2)}]
    prepared = asyncio.run(prepare(session, messages, {}, RUNTIME.engine.loaded, RUNTIME.options))
    folder = snapshot(tiny_model)
    assert folder is not None
    assert window.router_count(folder, messages, None, False) == len(prepared.request.prompt_tokens) > 200


def test_turns_are_left_out_whole_never_a_call_without_its_result(served, django_ready, workspace, steer):
    """Each turn calls a tool, then answers: every prompt a generation saw (the ones counted to fit it too)
    starts at a question, and every tool result follows the call it answers."""
    served("--no-worker", "--max-context", str(WINDOW))
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    seen = steer("read", {"path": "notes.txt"})

    async def run():
        ws = await chatws.connect(headers=[(b"host", b"127.0.0.1")])
        await chatws.new_session(ws)
        await chatws.coding(ws)
        for n in range(4):
            frames = await chatws.turn(ws, {"type": "prompt", "text": QUESTION.format(n)})
            assert not [f for f in frames if f["type"] == "error"], n
            assert chatws.kinds(frames).count("tool_end") == 1, n
        await ws.disconnect()

    asyncio.run(run())
    last = seen[-1]  # the last turn's answer, after its call: earlier turns left out, its own call and result in
    # Its first round left out at least the oldest turn (4 questions do not fit): the second round's fit starts
    # there, as a turn only grows, and never counts the whole conversation again.
    answering = [m for m in seen if QUESTION.format(3) in str(m) and m[-1]["role"] == "tool"]
    assert answering and not [m for m in answering if QUESTION.format(0) in str(m)]
    assert [m["role"] for m in last] == ["user", "assistant", "tool"]
    for messages in seen:
        talk = [m for m in messages if m["role"] != "system"]
        assert talk[0]["role"] == "user"
        calls = {c["id"] for m in talk if m["role"] == "assistant" for c in m.get("tool_calls") or []}
        assert {m["tool_call_id"] for m in talk if m["role"] == "tool"} <= calls


def test_a_conversation_past_the_servers_characters_sends_its_newest_turns(served, django_ready, monkeypatch):
    """--max-prompt-chars refuses a prompt by its characters before it is tokenized: a chat over it leaves out
    its oldest turns as one over the context does, and only a message over it alone is refused."""
    import chat.toolloop

    # No tools offered: their schemas count as characters too, and what is offered depends on what other tests
    # left in the worker's home (a memory vault's tools took a first question past CHARS in CI).
    monkeypatch.setattr(chat.toolloop.chat_tools, "available", lambda coding: {})
    served("--no-worker", "--max-context", str(WINDOW), "--max-prompt-chars", str(CHARS))

    async def run():
        ws = await chatws.connect(headers=[(b"host", b"127.0.0.1")])
        session = await chatws.new_session(ws)
        for n in range(4):  # from the 3rd on, the questions alone are past CHARS
            frames = await chatws.turn(ws, {"type": "prompt", "text": QUESTION.format(n)})
            errors = [f for f in frames if f["type"] == "error"]
            assert not errors, (n, errors)  # the old chat: 'the prompt is … characters' from the 3rd turn on
        frames = await chatws.turn(ws, {"type": "prompt", "text": QUESTION.format("long") * 3})
        items = await chatws.history(ws, session)
        await ws.disconnect()
        return frames, items

    frames, items = asyncio.run(run())
    replies = [i["meta"] for i in items if i["role"] == "assistant"]
    assert replies[3]["context_cut"]["hidden"] >= 4  # at least the two oldest turns left out
    error = next(f for f in frames if f["type"] == "error")
    assert "characters" in error["message"] and "does not fit even alone" in error["message"], error


def test_the_listing_says_the_context_the_server_allows(served, django_ready):
    """A model's /v1/models row (what a router's chat reads of its process) carries `context_limit`, the
    operator's --max-context where it is under the model's window; /props' n_ctx is the same number."""
    app = served("--no-worker", "--max-context", str(WINDOW))
    from tests.helpers import TINY_REPO

    [row] = [r for r in app.get("/v1/models").json()["data"] if r["id"] == TINY_REPO]  # the library's others too
    assert row["context_window"] > WINDOW and row["context_limit"] == WINDOW
    assert app.get("/props").json()["default_generation_settings"]["n_ctx"] == WINDOW
