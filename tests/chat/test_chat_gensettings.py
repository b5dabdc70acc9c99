"""The chat's generation settings beyond the sampling numbers (chat/gensettings.py)
over a real /ws/chat socket on the tiny model: max tokens, stop, logit bias
by token text, a response format held to its schema; bad values refused."""
from __future__ import annotations

import asyncio
import json

import pytest

from tests.chat import chatws

SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}, "required": ["colour"],
          "additionalProperties": False}


async def _settings(ws, session: str) -> dict:
    await ws.send_json_to({"type": "open_session", "path": session})
    while (frame := await ws.receive_json_from(timeout=10))["type"] != "history":
        assert frame["type"] != "error", frame
    return frame["settings"]["sampling"]


def test_settings_are_checked_stored_and_used_by_a_turn(engine):
    tokenizer = engine.loaded.tokenizer

    async def run():
        ws = await _connect_new()
        session = ws.session
        for bad, needle in [({"max_tokens": 0}, "max_tokens"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
                            ({"logit_bias": {"the": 500}}, "-100 to 100"), ({"logit_bias": {"": 1}}, "empty"),
                            ({"response_format": {"type": "yaml"}}, "response_format.type"),
                            ({"response_format": {"type": "json_schema"}}, "json_schema.schema"),
                            ({"logit_bias": {"99999999": 1}}, "logit_bias")]:
            await ws.send_json_to({"type": "set_sampling", "scope": "session", **bad})
            error = await ws.receive_json_from(timeout=10)
            assert error["type"] == "error" and needle in error["message"], (bad, error)
        await ws.send_json_to({"type": "set_sampling", "scope": "session", "temperature": 0, "max_tokens": 40,
                               "stop": "###", "logit_bias": {" ": -100, "\n": -100, "7": 2},
                               "response_format": {"type": "json_schema",
                                                   "json_schema": {"schema": SCHEMA, "any_whitespace": False}}})
        stored = await _settings(ws, session)
        blanks = {str(i) for text in (" ", "\n") for i in tokenizer.encode(text, add_special_tokens=False)}
        assert stored["max_tokens"] == 40 and stored["stop"] == ["###"] and stored["temperature"] == 0
        assert stored["logit_bias"] == {**{i: -100.0 for i in blanks}, "7": 2.0}  # text became its token ids
        assert stored["response_format"]["json_schema"]["schema"] == SCHEMA
        await ws.receive_json_from(timeout=10)  # sessions
        frames = await chatws.turn(ws, {"type": "prompt", "text": "what colour?"})
        answer = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
        assert json.loads(answer)["colour"] in ("red", "blue")  # held to the schema
        await ws.send_json_to({"type": "set_sampling", "scope": "session", "response_format": None,
                               "max_tokens": 3, "stop": None})
        stored = await _settings(ws, session)
        assert "response_format" not in stored and "stop" not in stored and stored["max_tokens"] == 3
        await ws.receive_json_from(timeout=10)  # sessions
        frames = await chatws.turn(ws, {"type": "prompt", "text": "and now?"})
        assert next(f for f in frames if f["type"] == "turn_end")
        await ws.send_json_to({"type": "open_session", "path": session})
        history = await ws.receive_json_from(timeout=10)
        meta = history["items"][-1]["meta"]
        assert meta["completion_tokens"] <= 3 and meta["finish_reason"] in ("length", "stop")
        await ws.disconnect()

    asyncio.run(run())


async def _connect_new():
    ws = await chatws.connect()
    await ws.send_json_to({"type": "new_session"})
    history = await ws.receive_json_from(timeout=10)
    ws.session = history["sessionId"]
    await ws.receive_json_from(timeout=10)  # sessions
    return ws


def test_the_socket_takes_the_stop_strings_v1_takes():
    """A turn sends `stop` on to /v1, so the socket's bound is /v1's: no string
    /v1 would take is refused here, and none it would refuse is stored."""
    from chat import gensettings
    from inference.engine import checks

    longest = "x" * checks.MAX_STOP_CHARS
    assert gensettings.check("stop", [longest] * checks.MAX_STOP_SEQUENCES) == [longest] * checks.MAX_STOP_SEQUENCES
    for bad in ([longest + "x"], ["x"] * (checks.MAX_STOP_SEQUENCES + 1)):
        with pytest.raises(ValueError, match="stop"):
            gensettings.check("stop", bad)
