"""The Anthropic Messages surface through the official `anthropic` SDK: create,
stream with the SDK's accumulator, tool use round trips, thinking blocks,
stop sequences, count_tokens, the prompt cache and errors in Anthropic's
shape. The random model is steered with a grammar where a test needs an
exact reply."""
from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import pytest

WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                            "required": ["city"]}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def forced(text: str) -> dict:
    return {"guided_grammar": "root ::= " + json.dumps(text)}


@pytest.fixture(scope="module")
def client(base_url):
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0)


def test_create_returns_a_message(client):
    msg = client.messages.create(model="m", max_tokens=40, system="Be brief.", messages=ASK,
                                 extra_body=forced("Sunny and mild."))
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Sunny and mild."
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0


def test_max_tokens_and_stop_sequences(client):
    short = client.messages.create(model="m", max_tokens=3, messages=ASK)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    stopped = client.messages.create(model="m", max_tokens=40, messages=ASK, stop_sequences=["world"],
                                     extra_body=forced("Hello world, bye."))
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "world"
    assert stopped.content[0].text == "Hello "


def test_stream_accumulates_the_final_message(client):
    with client.messages.stream(model="m", max_tokens=40, messages=ASK,
                                extra_body=forced("Sunny, then rain.")) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == "Sunny, then rain." == final.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_raw_event_grammar(base_url):
    body = {"model": "m", "max_tokens": 200, "messages": ASK, "stream": True, "tools": [WEATHER],
            **forced("Checking. " + CALL)}
    with httpx.stream("POST", base_url + "/v1/messages", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert "ping" in kinds
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use"]
    assert [s["index"] for s in starts] == [0, 1]
    assert kinds.count("content_block_stop") == 2
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == "Checking. "
    args = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert json.loads(args) == {"city": "Paris", "days": 2}
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-2]["usage"]["output_tokens"] > 0


def test_tool_use_round_trip(client):
    first = client.messages.create(model="m", max_tokens=120, messages=ASK, tools=[WEATHER],
                                   extra_body=forced(CALL))
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris", "days": 2} and use.id.startswith("toolu_")
    history = ASK + [{"role": "assistant", "content": first.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": [{"type": "text", "text": "18C, clear"}]},
                                                  {"type": "text", "text": "Thanks!"}]}]
    second = client.messages.create(model="m", max_tokens=20, messages=history, tools=[WEATHER],
                                    extra_body=forced("It is 18C."))
    assert second.content[0].text == "It is 18C." and second.stop_reason == "end_turn"
    def prompt(u):
        return u.input_tokens + (u.cache_read_input_tokens or 0)

    assert prompt(second.usage) > prompt(first.usage)


def test_streamed_tool_use_through_the_sdk(client):
    with client.messages.stream(model="m", max_tokens=120, messages=ASK, tools=[WEATHER],
                                tool_choice={"type": "any"}, extra_body=forced(CALL)) as stream:
        final = stream.get_final_message()
    (use,) = final.content
    assert use.type == "tool_use" and use.input == {"city": "Paris", "days": 2}
    assert final.stop_reason == "tool_use"


def test_thinking_blocks_and_dropped_on_reingest(client):
    msg = client.messages.create(model="m", max_tokens=60, messages=[{"role": "user", "content": "Hi"}],
                                 thinking={"type": "enabled", "budget_tokens": 1024},
                                 extra_body=forced("Greet back.</think>\n\nHello!"))
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "Greet back." and msg.content[1].text == "Hello!"
    again = client.messages.create(model="m", max_tokens=5, messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": msg.content},
        {"role": "user", "content": "Again"}])
    assert again.type == "message"


def test_thinking_blocks_carry_a_signature_and_the_stream_sends_it(client, base_url):
    """Anthropic's thinking blocks carry a signature; a stream sends it as a
    signature_delta before the block stops. message_start and message_delta
    agree on input_tokens (and on the cache reads) even when the cache served part."""
    body = {"model": "m", "max_tokens": 60, "messages": [{"role": "user", "content": "Hi " * 40}],
            "thinking": {"type": "enabled", "budget_tokens": 1024}, **forced("Greet back.</think>\n\nHello!")}
    msg = client.messages.create(**{k: v for k, v in body.items() if k != "guided_grammar"},
                                 extra_body=forced("Greet back.</think>\n\nHello!"))
    assert msg.content[0].type == "thinking" and msg.content[0].signature
    for _ in range(2):  # the second time, the prompt cache serves most of the prompt
        raw = httpx.post(base_url + "/v1/messages", json={**body, "stream": True}, timeout=60).text
        events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
        kinds = [(e["type"], e.get("delta", {}).get("type")) for e in events]
        sig = kinds.index(("content_block_delta", "signature_delta"))
        thinking = [i for i, k in enumerate(kinds) if k[1] == "thinking_delta"]
        assert thinking and max(thinking) < sig and kinds[sig + 1] == ("content_block_stop", None)
        assert events[sig]["delta"]["signature"] == msg.content[0].signature
        start = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
        delta = next(e for e in events if e["type"] == "message_delta")["usage"]
        assert start["input_tokens"] == delta["input_tokens"]
        assert start.get("cache_read_input_tokens") == delta.get("cache_read_input_tokens")
    assert delta.get("cache_read_input_tokens")  # the case where they could disagree


def test_count_tokens_matches_usage(client):
    counted = client.messages.count_tokens(model="m", system="Be brief.", messages=ASK, tools=[WEATHER])
    msg = client.messages.create(model="m", max_tokens=2, system="Be brief.", messages=ASK, tools=[WEATHER])
    assert counted.input_tokens == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 0


def test_cache_read_tokens_on_a_repeated_prefix(client):
    messages = [{"role": "user", "content": "A long shared question. " * 30}]
    client.messages.create(model="m", max_tokens=2, messages=messages)
    first = client.messages.count_tokens(model="m", messages=messages).input_tokens
    again = client.messages.create(model="m", max_tokens=2, messages=messages)
    assert again.usage.cache_read_input_tokens == first - 1  # all but the token left to prefill
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == first


@pytest.mark.parametrize("body, needle", [
    ({"messages": []}, "messages required"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}, "vision"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "/v1/chat/completions"),
    ({"messages": ASK, "logit_bias": {"1": 5}}, "logit_bias"),
    ({"messages": ASK, "stop_sequences": "x"}, "stop_sequences"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role"),  # system turns are accepted in place
    ({"messages": ASK, "thinking": "yes"}, "thinking"),
    ({"messages": [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]}, "type must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}]}, "vision"),
])
def test_errors_in_anthropic_shape(inproc, body, needle):
    r = inproc.post("/v1/messages", json={"model": "m", "max_tokens": 5, **body})
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]


def test_max_tokens_is_required_as_on_anthropic_but_not_to_count(inproc):
    """A Messages request without max_tokens is refused as Anthropic refuses
    it, streamed or not; count_tokens takes none (the SDK sends none there)."""
    for stream in (False, True):
        r = inproc.post("/v1/messages", json={"model": "m", "messages": ASK, "stream": stream})
        assert r.status_code == 400, r.text
        assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "max_tokens: Field required"}}
    r = inproc.post("/v1/messages", json={"model": "m", "messages": ASK, "max_tokens": None})
    assert r.status_code == 400 and r.json()["error"]["message"] == "max_tokens: Input should be a valid integer"
    counted = inproc.anthropic().messages.count_tokens(model="m", messages=ASK)
    assert counted.input_tokens > 0


def test_output_config_format_is_enforced_and_the_sdk_parses_it(client):
    """`messages.parse(output_format=Model)` sends output_config.format; the random model's reply is held to it."""
    from typing import Literal

    import pydantic

    class Person(pydantic.BaseModel):
        name: Literal["Ana", "Ben", "Chloe"]
        ok: bool

    for seed in range(3):
        reply = client.messages.parse(model="m", max_tokens=120, messages=ASK, output_format=Person,
                                      extra_body={"seed": seed, "temperature": 1.0, "top_k": 0})
        assert reply.stop_reason == "end_turn" and isinstance(reply.parsed_output, Person), reply.content
        text = reply.content[0].text
        assert text == json.dumps(reply.parsed_output.model_dump()), text  # compact, as json.dumps writes it
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="m", max_tokens=5, messages=ASK, extra_body={"output_config": {
            "format": {"type": "json_schema", "schema": {"type": "object"}}, "verbosity": "low"}})
    assert "output_config.verbosity" in bad.value.body["error"]["message"]


def test_sdk_raises_typed_errors(client):
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="m", max_tokens=5, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    r = httpx.post(str(client.base_url).rstrip("/") + "/v1/messages", content=b"{nope")
    assert r.status_code == 400 and r.json()["error"]["message"] == "invalid JSON body"


def test_unknown_adapter_on_every_surface(base_url):
    chat = httpx.post(base_url + "/v1/chat/completions", json={"messages": ASK, "adapter": "mine"})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "adapter"
    msg = httpx.post(base_url + "/v1/messages", json={"messages": ASK, "max_tokens": 3, "adapter": "mine"})
    assert msg.status_code == 400 and "unknown adapter" in msg.json()["error"]["message"]
    resp = httpx.post(base_url + "/v1/responses", json={"input": "hi", "adapter": "mine"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "adapter"
    ok = httpx.post(base_url + "/v1/messages", json={"messages": ASK, "max_tokens": 2, "adapter": None})
    assert ok.status_code == 200


def test_a_client_that_leaves_while_its_request_waits_ends_the_wait_cleanly():
    from inference.protocols import anthropic_reply

    async def run():
        ended = []

        async def events():  # a request still queued: no event comes
            try:
                await asyncio.Event().wait()
                yield None
            finally:
                ended.append(True)  # the engine's stream closed: its row is stopped

        waiting = asyncio.ensure_future(anthropic_reply._admitted(events(), lambda: None))
        await asyncio.sleep(0.05)
        waiting.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return ended

    assert asyncio.run(run()) == [True]


PREFILLED = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ar"}]


def _tokens(local_engine, text: str) -> int:
    return len(local_engine.loaded_model.tokenizer.encode(text, add_special_tokens=False))


def _input(msg) -> int:
    return msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)


def test_a_prefill_is_continued_and_the_reply_is_only_the_continuation(inproc, local_engine):
    """A final assistant message is left open: the prompt ends in its text, with
    no generation prompt after it, and the reply holds only what follows."""
    client = inproc.anthropic()
    msg = client.messages.create(model="m", max_tokens=20, messages=PREFILLED, extra_body=forced(" you?"))
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == " you?"  # its space kept
    assert _input(msg) == _tokens(local_engine, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nar")
    assert client.messages.count_tokens(model="m", messages=PREFILLED).input_tokens == _input(msg)
    with client.messages.stream(model="m", max_tokens=20, messages=PREFILLED,
                                extra_body=forced(" you?")) as stream:
        assert "".join(stream.text_stream) == " you?"
    # An empty final assistant message prefills nothing: the reply is a turn of its own, as without it.
    empty = client.messages.create(model="m", max_tokens=1, messages=[*PREFILLED[:1], {"role": "assistant",
                                                                                       "content": ""}])
    plain = client.messages.create(model="m", max_tokens=1, messages=PREFILLED[:1])
    assert _input(empty) == _input(plain)


def test_a_prefill_continues_as_text_not_as_a_thinking_block(inproc):
    """The reply continues the message's text: a <think> tag it writes is text (the template opened no block)."""
    msg = inproc.anthropic().messages.create(model="m", max_tokens=40, messages=PREFILLED,
                                             extra_body=forced("<think>x</think> done"))
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "<think>x</think> done"


@pytest.mark.parametrize("last, extra, needle", [
    ("ar ", {}, "messages[1].content: final assistant content cannot end with trailing whitespace"),
    ([{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}], {"tools": [WEATHER]},
     "messages[1]: a final assistant message with tool_use blocks cannot be continued"),
    ("ar", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking cannot be enabled"),
    ("{", {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
     "output_config.format describes a whole message"),
    ("{", {"output_format": {"type": "json_schema", "schema": {"type": "object"}}}, "output_format describes"),
    ("ar", {"tools": [WEATHER], "tool_choice": {"type": "any"}}, "tool_choice: an enforced tool choice"),
])
def test_a_prefill_that_cannot_be_continued_is_refused(inproc, last, extra, needle):
    r = inproc.post("/v1/messages", json={"model": "m", "max_tokens": 5, **extra, "messages": [
        PREFILLED[0], {"role": "assistant", "content": last}]})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]


PICK = {"type": "json_schema", "schema": {"type": "object", "properties": {"name": {"enum": ["Ana", "Ben"]}},
                                          "required": ["name"], "additionalProperties": False}}


def test_the_beta_output_format_is_output_config_format(inproc):
    """The structured-outputs beta's `output_format` is enforced as output_config.format is."""
    client = inproc.anthropic()
    for body in ({"output_format": PICK}, {"output_format": PICK, "output_config": {"format": PICK}}):
        r = client.beta.messages.with_raw_response.create(model="m", max_tokens=40, messages=ASK,
                                                          betas=["structured-outputs-2025-11-13"],
                                                          extra_body={**body, "temperature": 1.0, "seed": 3})
        assert "output_format" not in r.headers.get("x-hearth-ignored-fields", "")
        assert json.loads(r.parse().content[0].text)["name"] in ("Ana", "Ben")
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="m", max_tokens=5, messages=ASK, extra_body={
            "output_format": PICK, "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}})
    assert "output_format and output_config.format differ" in bad.value.body["error"]["message"]
