"""A tool call the generation did not finish (its token limit or a stop
sequence ended the text inside the call) is never reported as a finished
call, nor given arguments the model did not write, on any protocol,
streamed or not; and a reply's blocks come in the order they were
generated either way. A grammar steers the random model into exact
markup; the app runs in this process."""
from __future__ import annotations

import json

import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"days": {"type": "integer"}, "city": {"type": "string"}},
        "required": ["city"]}}}
FLAT = {"type": "function", **WEATHER["function"]}  # the Responses form
CLAUDE = {"name": "get_weather", "description": "Weather for a city",
          "input_schema": WEATHER["function"]["parameters"]}
ASK = [{"role": "user", "content": "Weather?"}]
# A long last value: a limit of LIMIT tokens falls inside it (the text before it is 67 characters, so at
# most 67 tokens, and the value is longer than any LIMIT tokens of this vocabulary could spell).
ARGS = '{"days": 2, "city": "' + "Rome, " * 60 + '"}'
CALL = '<tool_call>{"name": "get_weather", "arguments": ' + ARGS + "}</tool_call>"
LIMIT = 72
SHORT = '<tool_call>{"name": "get_weather", "arguments": {"days": 2, "city": "Rome"}}</tool_call>'


def forced(text: str) -> dict:
    return {"guided_grammar": "root ::= " + json.dumps(text)}


def events(inproc, path: str, body: dict) -> list[dict]:
    with inproc.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data: {")]


def cut_text(arguments: str) -> None:
    """Arguments as far as the model wrote them: a prefix of the call's, never closed or repaired."""
    assert ARGS.startswith(arguments) and len(arguments) < len(ARGS), arguments
    with pytest.raises(ValueError):
        json.loads(arguments)


# -- chat completions ----------------------------------------------------------

def chat(inproc, **fields) -> tuple[dict, dict]:
    """The non-streamed choice and what the stream said: content, calls, finish reason."""
    body = {"model": "m", "messages": ASK, "tools": [WEATHER], "max_tokens": 400, **forced(CALL), **fields}
    choice = inproc.post("/v1/chat/completions", json=body).json()["choices"][0]
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in events(inproc, "/v1/chat/completions", body):
        for c in chunk["choices"]:
            content += c["delta"].get("content") or ""
            finish = c["finish_reason"] or finish
            for piece in c["delta"].get("tool_calls") or []:
                call = calls.setdefault(piece["index"], {"name": "", "arguments": ""})
                call["name"] += piece.get("function", {}).get("name") or ""
                call["arguments"] += piece.get("function", {}).get("arguments") or ""
    return choice, {"content": content, "calls": [calls[i] for i in sorted(calls)], "finish": finish}


def test_chat_a_call_cut_by_max_tokens_keeps_its_text_and_the_length_finish(inproc):
    choice, streamed = chat(inproc, max_tokens=LIMIT)
    assert choice["finish_reason"] == streamed["finish"] == "length"
    (call,) = choice["message"]["tool_calls"]
    cut_text(call["function"]["arguments"])
    assert streamed["calls"] == [{"name": "get_weather", "arguments": call["function"]["arguments"]}]
    assert not choice["message"]["content"] and not streamed["content"]


def test_chat_a_call_cut_by_a_stop_sequence_keeps_its_text_and_the_stop_finish(inproc):
    choice, streamed = chat(inproc, stop=["Ro"])
    assert choice["finish_reason"] == streamed["finish"] == "stop"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{"days": 2, "city": "'  # not {"days": 2, "city": ""}
    assert streamed["calls"] == [{"name": "get_weather", "arguments": '{"days": 2, "city": "'}]
    assert not choice["message"]["content"] and not streamed["content"]


def test_chat_markup_cut_before_the_name_is_neither_a_call_nor_content(inproc):
    choice, streamed = chat(inproc, stop=["get_"])
    assert choice["finish_reason"] == streamed["finish"] == "stop"
    assert not choice["message"].get("tool_calls") and not streamed["calls"]
    assert not choice["message"]["content"] and not streamed["content"]


def test_chat_a_forced_call_cut_before_its_name_leaks_no_markup(inproc):
    """Stop sequences are matched inside a forced call's markup too (decoded text, as everywhere)."""
    body = {"model": "m", "messages": ASK, "tools": [WEATHER], "max_tokens": 80, "stop": ["get_"],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    for stream in (False, True):
        if stream:
            chunks = events(inproc, "/v1/chat/completions", body)
            content = "".join(c["delta"].get("content") or "" for ch in chunks for c in ch["choices"])
            calls = [c for ch in chunks for c in ch["choices"] if c["delta"].get("tool_calls")]
            finish = [c["finish_reason"] for ch in chunks for c in ch["choices"] if c["finish_reason"]][-1]
        else:
            choice = inproc.post("/v1/chat/completions", json=body).json()["choices"][0]
            content, calls, finish = choice["message"]["content"] or "", choice["message"].get("tool_calls"), \
                choice["finish_reason"]
        assert finish == "stop" and not calls and "<tool_call>" not in content, (stream, content)


# -- Anthropic Messages --------------------------------------------------------

def claude_body(**fields) -> dict:
    return {"model": "m", "messages": ASK, "tools": [CLAUDE], "max_tokens": 400, **forced(CALL), **fields}


def claude_stream(inproc, body: dict) -> tuple[list[dict], dict]:
    """The blocks a raw stream builds (a tool_use block's input as its partial_json text) and its message_delta."""
    blocks: list[dict] = []
    delta: dict = {}
    for event in events(inproc, "/v1/messages", body):
        if event["type"] == "content_block_start":
            blocks.append({**event["content_block"], "partial": ""})
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "input_json_delta":
            blocks[-1]["partial"] += event["delta"]["partial_json"]
        elif event["type"] == "message_delta":
            delta = event["delta"]
    return blocks, delta


@pytest.mark.parametrize(("fields", "reason", "sequence"), [
    ({"max_tokens": LIMIT}, "max_tokens", None),
    ({"stop_sequences": ["Ro"]}, "stop_sequence", "Ro"),
])
def test_anthropic_a_cut_call_is_no_tool_use_and_its_input_holds_what_was_written(inproc, fields, reason, sequence):
    body = claude_body(**fields)
    msg = inproc.post("/v1/messages", json=body).json()
    assert (msg["stop_reason"], msg["stop_sequence"]) == (reason, sequence)
    (use,) = msg["content"]
    assert use["type"] == "tool_use" and use["input"] == {"days": 2}  # the cut member is not made up
    blocks, delta = claude_stream(inproc, body)
    assert (delta["stop_reason"], delta["stop_sequence"]) == (reason, sequence)
    (streamed,) = blocks
    assert streamed["type"] == "tool_use"
    cut_text(streamed["partial"])
    sdk = inproc.anthropic()
    with sdk.messages.stream(**{k: v for k, v in body.items() if k != "guided_grammar"},
                             extra_body=forced(CALL)) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == reason and [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].input == {"days": 2}


# -- Responses -----------------------------------------------------------------

def responses_body(**fields) -> dict:
    return {"model": "m", "input": "Weather?", "tools": [FLAT], "max_output_tokens": 400, **forced(CALL), **fields}


def responses_final(inproc, body: dict) -> dict:
    return events(inproc, "/v1/responses", body)[-1]["response"]


def test_responses_a_call_cut_by_max_output_tokens_is_incomplete(inproc):
    body = responses_body(max_output_tokens=LIMIT)
    for reply in (inproc.post("/v1/responses", json=body).json(), responses_final(inproc, body)):
        assert reply["status"] == "incomplete"
        assert reply["incomplete_details"] == {"reason": "max_output_tokens"}
        (call,) = reply["output"]
        assert call["type"] == "function_call" and call["status"] == "incomplete"
        cut_text(call["arguments"])


def test_responses_a_call_cut_by_a_stop_sequence_is_an_incomplete_item(inproc):
    body = responses_body(stop=["Ro"])
    for reply in (inproc.post("/v1/responses", json=body).json(), responses_final(inproc, body)):
        (call,) = reply["output"]
        assert call["type"] == "function_call" and call["status"] == "incomplete"
        assert call["arguments"] == '{"days": 2, "city": "'


# -- block order ---------------------------------------------------------------

@pytest.mark.parametrize(("text", "kinds"), [
    (SHORT + " After.", ["tool_use", "text"]),
    ("Before. " + SHORT + " After.", ["text", "tool_use", "text"]),
])
def test_anthropic_blocks_come_in_generation_order_streamed_or_not(inproc, text, kinds):
    body = claude_body(**forced(text))
    msg = inproc.post("/v1/messages", json=body).json()
    blocks, _ = claude_stream(inproc, body)
    assert [b["type"] for b in msg["content"]] == [b["type"] for b in blocks] == kinds
    assert [b["text"] for b in msg["content"] if b["type"] == "text"] == \
        [t for t in ("Before. ", " After.") if t in text]


@pytest.mark.parametrize(("text", "kinds"), [
    (SHORT + " After.", ["function_call", "message"]),
    ("Before. " + SHORT + " After.", ["message", "function_call", "message"]),
])
def test_responses_items_come_in_generation_order_streamed_or_not(inproc, text, kinds):
    body = responses_body(**forced(text))
    created = inproc.post("/v1/responses", json=body).json()
    streamed = responses_final(inproc, body)
    for reply in (created, streamed):
        assert [i["type"] for i in reply["output"]] == kinds
        assert len({i["id"] for i in reply["output"]}) == len(kinds)
        assert [i["status"] for i in reply["output"]] == ["completed"] * len(kinds)


def test_finished_calls_then_a_stop_sequence_are_tool_use_and_a_cut_call_is_not_replayed():
    """Anthropic's stop_reason is `tool_use` when every call was finished, a stop sequence after them or not
    (`stop_sequence` still names it); a stored Responses turn does not replay a call the reply was cut off in."""
    from inference.engine.types import GenerationEvent
    from inference.protocols.anthropic_reply import stop_reason
    from inference.protocols.output import Message
    from inference.protocols.responses_reply import chat_output
    from inference.protocols.toolcalls import ToolCall

    whole = ToolCall("get_weather", '{"city": "Rome"}', "call_1")
    cut = ToolCall("get_weather", '{"ci', "call_2", cut=True)
    stopped = GenerationEvent(finish_reason="stop", stop_sequence="After")
    assert stop_reason(stopped, [whole]) == "tool_use"
    assert stop_reason(stopped, [whole, cut]) == "stop_sequence"
    assert stop_reason(GenerationEvent(finish_reason="length"), [whole]) == "max_tokens"
    replay = chat_output(Message(content="", tool_calls=[whole, cut]))
    assert [c["id"] for c in replay[0]["tool_calls"]] == ["call_1"]
