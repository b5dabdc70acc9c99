"""A dashboard chat on a model with a small context (`--max-context 512`,
the demo model's window) and a model that never stops by itself (the tiny
random model, as the demo model is before it has trained): a reply the
session sets no max_tokens for is held to a quarter of the context
(chat/toolloop.py `reply_budget`), so the conversation goes on past its
first message, and the stored reply says it stopped at that limit."""
from __future__ import annotations

import asyncio

from tests.chat import chatws

WINDOW = 512


def test_a_small_context_keeps_room_for_a_conversation(served, django_ready):
    served("--no-worker", "--max-context", str(WINDOW))

    async def run():
        ws = await chatws.connect(headers=[(b"host", b"127.0.0.1")])
        session = await chatws.new_session(ws)
        for question in ("Hello!", "Tell me more.", "And then?"):
            frames = await chatws.turn(ws, {"type": "prompt", "text": question})
            errors = [f for f in frames if f["type"] == "error"]
            assert not errors, errors  # the old chat: the first reply filled the window, the second was refused
            context = next(f for f in frames if f["type"] == "context")
            assert context["contextWindow"] == WINDOW  # the cap the server holds turns to, not the model's 2048
        items = await chatws.history(ws, session)
        replies = [item["meta"] for item in items if item["role"] == "assistant"]
        assert len(replies) == 3 and not any(meta.get("error") for meta in replies)
        for meta in replies:
            assert meta["completion_tokens"] <= WINDOW // 4
            if meta["finish_reason"] == "length":  # what the page shows under the reply
                assert meta["reply_budget"] == {"max_tokens": WINDOW // 4, "context_window": WINDOW}
        assert any(meta["finish_reason"] == "length" for meta in replies)  # the random model babbles on
        await ws.disconnect()

    asyncio.run(run())


def test_a_max_tokens_the_session_sets_wins(served, django_ready):
    served("--no-worker", "--max-context", str(WINDOW))

    async def run():
        ws = await chatws.connect(headers=[(b"host", b"127.0.0.1")])
        session = await chatws.new_session(ws)
        await ws.send_json_to({"type": "set_sampling", "scope": "session", "max_tokens": 200})
        await chatws.history(ws, session)
        await ws.receive_json_from(timeout=10)  # sessions
        await chatws.turn(ws, {"type": "prompt", "text": "Hello!"})
        meta = (await chatws.history(ws, session))[-1]["meta"]
        assert WINDOW // 4 < meta["completion_tokens"] <= 200 or meta["finish_reason"] == "stop"
        assert "reply_budget" not in meta
        await ws.disconnect()

    asyncio.run(run())
