"""The Responses surface through the official `openai` SDK: create and
stream, tools with function_call / function_call_output items, stored
continuation over three turns, retrieve/delete, expiry, JSON-schema text
format and reasoning items. A grammar steers the random model where a test
needs an exact reply."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def forced(text: str) -> dict:
    return {"guided_grammar": "root ::= " + json.dumps(text)}


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def test_create_text(client):
    r = client.responses.create(model="m", input="Say something.", instructions="Be brief.",
                                max_output_tokens=40, extra_body=forced("Hello there."))
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == "Hello there." and r.instructions == "Be brief."
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_max_output_tokens_makes_it_incomplete(client):
    r = client.responses.create(model="m", input="Talk.", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_stream_accumulates(client):
    with client.responses.stream(model="m", input="Say something.", max_output_tokens=40,
                                 extra_body=forced("Streamed words.")) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "Streamed words." == final.output_text
    assert final.status == "completed"


def test_raw_stream_event_chain(base_url):
    body = {"model": "m", "input": "Weather?", "stream": True, "tools": [WEATHER], "max_output_tokens": 200,
            **forced("Checking. " + CALL)}
    with httpx.stream("POST", base_url + "/v1/responses", json=body, timeout=60) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for name in ("response.output_text.done", "response.content_part.done", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done"):
        assert name in kinds, name
    assert kinds.count("response.output_item.done") == 2
    args = next(e for e in events if e["type"] == "response.function_call_arguments.done")["arguments"]
    assert json.loads(args) == {"city": "Paris"}
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]


def test_tools_and_three_turns_of_stored_continuation(client):
    first = client.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER],
                                    instructions="You are terse.", max_output_tokens=200, extra_body=forced(CALL))
    (call,) = [i for i in first.output if i.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_")
    second = client.responses.create(
        model="m", previous_response_id=first.id, tools=[WEATHER], max_output_tokens=40,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
        extra_body=forced("It is 18C."))
    assert second.output_text == "It is 18C." and second.previous_response_id == first.id
    assert second.instructions == "You are terse."  # carried forward
    third = client.responses.create(model="m", previous_response_id=second.id, input="And tomorrow?",
                                    tools=[WEATHER], max_output_tokens=40, extra_body=forced("Rain."))
    assert third.output_text == "Rain."
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens
    # the stored history is the prefix of the next prompt, so the prompt cache serves it
    assert third.usage.input_tokens_details.cached_tokens > second.usage.input_tokens // 2


def test_unknown_previous_id_retrieve_and_delete(client, base_url):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", input="x", previous_response_id="resp_nope")
    r = client.responses.create(model="m", input="Keep me.", max_output_tokens=5)
    assert client.responses.retrieve(r.id).id == r.id
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    assert httpx.delete(base_url + f"/v1/responses/{r.id}").status_code == 404
    unstored = client.responses.create(model="m", input="Forget me.", max_output_tokens=3, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    stats = httpx.get(base_url + "/stats").json()["response_store"]
    assert stats["entries"] >= 1 and stats["max_bytes"] == 32 << 20 and stats["ttl_ms"] == 3_600_000


def test_json_schema_text_format(client, tiny_model):
    from huggingface_hub import snapshot_download
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(snapshot_download(tiny_model, local_files_only=True) + "/tokenizer.json")
    no_whitespace = {str(i): -100 for i in range(tok.get_vocab_size()) if not tok.decode([i]).strip()}
    schema = {"type": "object", "properties": {"mood": {"type": "string", "enum": ["calm", "busy"]}},
              "required": ["mood"], "additionalProperties": False}
    r = client.responses.create(model="m", input="Mood?", max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "mood", "schema": schema,
                                                 "strict": True}}, extra_body={"logit_bias": no_whitespace})
    assert json.loads(r.output_text)["mood"] in ("calm", "busy")


def test_a_named_tool_choice_beside_a_text_format_is_still_the_call(client):
    """instructor's RESPONSES_TOOLS sends both: the call is enforced, the format waits for the next message."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
              "required": ["city"], "additionalProperties": False}
    tool = {**WEATHER, "strict": True, "parameters": schema}
    raw = client.responses.with_raw_response.create(
        # Room for the whitespace runs the tool grammar allows (up to 16 each) that the random model may take.
        model="m", input="Weather in Paris?", tools=[tool], max_output_tokens=300,
        tool_choice={"type": "function", "name": "get_weather"},
        text={"format": {"type": "json_schema", "name": "w", "schema": schema, "strict": True}})
    r = raw.parse()
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Rome")
    assert "after the forced tool call" in raw.headers["warning"]


def test_reasoning_item(client):
    r = client.responses.create(model="m", input="Hi", reasoning={"effort": "high"}, max_output_tokens=60,
                                extra_body=forced("Greet back.</think>\n\nHello!"))
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].summary[0].text == "Greet back." and r.output_text == "Hello!"
    assert r.usage.output_tokens_details.reasoning_tokens > 0


def test_a_reply_cut_while_thinking_reads_the_same_streamed_or_not(client):
    """Cut by max_output_tokens inside its reasoning: the reasoning item is
    incomplete and no message item follows, whether streamed or not."""
    args = {"model": "m", "input": "Hi", "reasoning": {"effort": "high"}, "max_output_tokens": 4,
            "extra_body": forced("Thinking about it for a long while.</think>\n\nHello!")}
    whole = client.responses.create(**args)
    streamed = [e.response for e in client.responses.create(**args, stream=True) if e.type == "response.incomplete"][0]
    for r in (whole, streamed):
        assert r.status == "incomplete" and [(i.type, i.status) for i in r.output] == [("reasoning", "incomplete")]


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": [{"type": "mystery"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "text": "json"}, "text"),
    ({"input": "x", "reasoning": "high"}, "reasoning"),
    ({"input": "x", "tool_choice": 5}, "tool_choice"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": "ten"}, "max_output_tokens"),
])
def test_bad_requests(inproc, body, param):
    r = inproc.post("/v1/responses", json={"model": "m", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_stored_turns_expire(inproc):
    """A store with a one-second lifetime (`hearth serve --response-ttl 1`), in process."""
    from hearth.root import RUNTIME
    from inference.protocols.response_store import ResponseStore

    def create(**fields):
        return inproc.post("/v1/responses", json={"model": "m", "max_output_tokens": 3, **fields})

    before, RUNTIME.responses = RUNTIME.responses, ResponseStore(ttl_s=1)
    try:
        first = create(input="Soon gone.").json()
        assert create(input="still here", previous_response_id=first["id"]).status_code == 200
        time.sleep(1.5)
        gone = create(input="x", previous_response_id=first["id"])
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "response_not_found", gone.text
    finally:
        RUNTIME.responses = before


def test_sdk_stream_with_a_tool_call(client):
    with client.responses.stream(model="m", input="Weather in Paris?", tools=[WEATHER], max_output_tokens=200,
                                 extra_body=forced(CALL)) as stream:
        args = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads("".join(args)) == json.loads(call.arguments) == {"city": "Paris"}


def test_system_items_carry_into_continuations(client):
    first = client.responses.create(model="m", max_output_tokens=4, input=[
        {"role": "developer", "content": "Answer in French. " * 10}, {"role": "user", "content": "Bonjour?"}])
    second = client.responses.create(model="m", previous_response_id=first.id, input="Encore?", max_output_tokens=4)
    # the developer text still opens the prompt, so the first turn's prompt comes from the cache
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 32  # template tail differs


def test_text_after_a_tool_call_streams_as_its_own_item(base_url):
    body = {"model": "m", "input": "Weather?", "stream": True, "tools": [WEATHER], "max_output_tokens": 200,
            **forced("A. " + CALL + " B.")}
    with httpx.stream("POST", base_url + "/v1/responses", json=body, timeout=60) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    final = events[-1]["response"]
    kinds = [i["type"] for i in final["output"]]
    assert kinds == ["message", "function_call", "message"]
    first, last = final["output"][0], final["output"][2]
    assert first["id"] != last["id"]
    assert first["content"][0]["text"] == "A. " and last["content"][0]["text"] == " B."
    done = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    assert done == ["A. ", " B."]
