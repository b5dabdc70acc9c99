"""What real agents and SDKs send: Claude Code's system turns inside
Anthropic `messages`, prompts longer than the context window (refused before
any prefill with the errors clients act on), the operator's context cap, and
the extra fields of the OpenAI, Responses and Anthropic SDKs as they send
them (accepted, honoured where they mean something here, never a 500; the
ones that ask for what Hearth does not do are test_unhonoured.py's)."""
from __future__ import annotations

import json
import re

import anthropic
import httpx
import openai
import pytest

from inference.protocols import anthropic as messages_protocol
from inference.protocols.errors import RequestError

# Over 2,048 tokens (the tiny model's window) in every protocol.
LONG = " ".join(f"fact {i}: the fox jumps over the lazy dog." for i in range(200))
WINDOW = 2048
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
TWO_CALLS = CALL % "Paris" + CALL % "Rome"
THEN_TWO_CALLS = "Plan.</think>\n\n" + TWO_CALLS  # a reply when thinking is on
WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
OPENAI_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                   "parameters": WEATHER["input_schema"]}}
EPHEMERAL = {"type": "ephemeral"}


def forced(text: str) -> dict:
    return {"guided_grammar": "root ::= " + json.dumps(text)}


@pytest.fixture
def app(served):
    """The serving stack in this process, with `hearth serve`'s defaults."""
    return served()


@pytest.fixture
def oai(app):
    return app.openai()


@pytest.fixture
def claude(app):
    return app.anthropic()


def _requests_total(app) -> int:
    return app.get("/stats").json()["engine"]["requests_total"]


# -- Claude Code's system turns ---------------------------------------------
CLAUDE_CODE_TURNS = [
    {"role": "user", "content": [{"type": "text", "text": "List the files.", "cache_control": EPHEMERAL}]},
    {"role": "system", "content": "The user switched to plan mode."},
    {"role": "assistant", "content": "Planning."},
    {"role": "system", "content": [{"type": "text", "text": "Reminder one."},
                                   {"type": "text", "text": "Reminder two.", "cache_control": EPHEMERAL}]},
    {"role": "user", "content": "Go on."},
]


def test_system_turns_in_messages_render_in_place_in_order():
    chat = messages_protocol.to_chat_body({"system": "Top.", "messages": CLAUDE_CODE_TURNS, "max_tokens": 5})
    assert chat["messages"] == [
        {"role": "system", "content": "Top."}, {"role": "user", "content": "List the files."},
        {"role": "system", "content": "The user switched to plan mode."},
        {"role": "assistant", "content": "Planning."},
        {"role": "system", "content": "Reminder one.\n\nReminder two."}, {"role": "user", "content": "Go on."}]
    with pytest.raises(RequestError) as bad:
        messages_protocol.to_chat_body({"messages": [{"role": "tool", "content": "x"}], "max_tokens": 5})
    assert bad.value.param == "messages[0].role"


def test_claude_code_request_with_system_turns(claude, oai, tiny_model):
    system = [{"type": "text", "text": "You are an agent.", "cache_control": EPHEMERAL}]
    msg = claude.messages.create(model="m", max_tokens=20, system=system, messages=CLAUDE_CODE_TURNS,
                                 extra_body=forced("Done."))
    assert msg.content[0].text == "Done." and msg.stop_reason == "end_turn"
    counted = claude.messages.count_tokens(model="m", system=system, messages=CLAUDE_CODE_TURNS)
    # The same turns, in the same order, through chat completions: the same prompt.
    as_chat = [{"role": "system", "content": "You are an agent."}] + messages_protocol.to_chat_body(
        {"messages": CLAUDE_CODE_TURNS, "max_tokens": 1})["messages"]
    same = oai.chat.completions.create(model=tiny_model, messages=as_chat, max_tokens=1)
    served = msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == same.usage.prompt_tokens == served


# -- prompts longer than the context window ---------------------------------
def _long_count(claude) -> int:
    n = claude.messages.count_tokens(model="m", messages=[{"role": "user", "content": LONG}]).input_tokens
    assert n > WINDOW  # count_tokens counts what generation would refuse
    return n


def _openai_refusal(response: httpx.Response, param: str) -> int:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param,
                                                              "context_length_exceeded")
    found = re.search(r"maximum context length is (\d+) tokens\. However, the prompt resulted in (\d+) tokens",
                      error["message"])
    assert found and int(found[1]) == WINDOW, error["message"]
    return int(found[2])


@pytest.mark.parametrize("stream", [False, True])
def test_too_long_chat_is_refused_before_prefill(app, claude, tiny_model, stream):
    n = _long_count(claude)
    before = _requests_total(app)
    body = {"model": tiny_model, "messages": [{"role": "user", "content": LONG}], "max_tokens": 5,
            "stream": stream}
    with app.stream("POST", "/v1/chat/completions", json=body, timeout=60) as r:
        r.read()
    assert _openai_refusal(r, "messages") == n
    assert _requests_total(app) == before  # never queued, never prefilled


def test_too_long_completion_and_responses(app, oai, tiny_model):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.completions.create(model=tiny_model, prompt=LONG, max_tokens=5)
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "prompt"
    for stream in (False, True):
        body = {"model": tiny_model, "input": LONG, "max_output_tokens": 5, "stream": stream}
        with app.stream("POST", "/v1/responses", json=body, timeout=60) as r:
            r.read()
        assert _openai_refusal(r, "input") > WINDOW
    with pytest.raises(openai.BadRequestError) as sdk:
        oai.responses.create(model=tiny_model, input=LONG, stream=True)
    assert sdk.value.code == "context_length_exceeded"


@pytest.mark.parametrize("stream", [False, True])
def test_too_long_message_says_prompt_is_too_long(app, claude, stream):
    n = _long_count(claude)
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": LONG}], "stream": stream}
    with app.stream("POST", "/v1/messages", json=body, timeout=60) as r:
        r.read()
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": f"prompt is too long: {n} tokens > {WINDOW - 1} maximum"}}
    with pytest.raises(anthropic.BadRequestError) as sdk:
        claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": LONG}])
    assert sdk.value.body["error"]["message"] == f"prompt is too long: {n} tokens > {WINDOW - 1} maximum"


# -- the operator's cap ------------------------------------------------------
def test_operator_cap_keeps_its_type_and_speaks_anthropic(served, tiny_model):
    capped = served("--max-context", "300")
    text = " ".join(f"fact {i}: the fox jumps over the lazy dog." for i in range(40))
    for stream in (False, True):
        body = {"model": tiny_model, "messages": [{"role": "user", "content": text}], "stream": stream}
        r = capped.post("/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("memory_admission", "context_over_budget", None)
        assert "300" in error["message"]
    claude = capped.anthropic()
    ask = [{"role": "user", "content": text}]
    n = claude.messages.count_tokens(model="m", messages=ask).input_tokens
    assert 300 <= n < WINDOW
    for stream in (False, True):
        r = capped.post("/v1/messages", json={"model": "m", "max_tokens": 5, "messages": ask, "stream": stream},
                        timeout=60)
        assert r.status_code == 400
        assert r.json()["error"] == {"type": "invalid_request_error",
                                     "message": f"prompt is too long: {n} tokens > 299 maximum"}


# -- the fields SDKs and agents send -----------------------------------------
def test_chat_fields_are_accepted(oai, tiny_model):
    extras = dict(user="u-1", metadata={"run": "7"}, service_tier="auto", store=False, prompt_cache_key="agent-1",
                  parallel_tool_calls=True, seed=3)
    stream = oai.chat.completions.create(model=tiny_model, messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=4, stream=True, stream_options={"include_usage": True},
                                         **extras)
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    done = oai.completions.create(model=tiny_model, prompt="Hi", max_tokens=3, user="u-1",
                                  stream=True, stream_options={"include_usage": True})
    assert [c for c in done][-1].usage.total_tokens > 0


def test_parallel_tool_calls_false_keeps_one_call(oai, tiny_model):
    ask = dict(model=tiny_model, messages=[{"role": "user", "content": "Weather?"}], tools=[OPENAI_WEATHER],
               max_tokens=400, extra_body=forced(TWO_CALLS))
    both = oai.chat.completions.create(**ask)
    assert [json.loads(c.function.arguments)["city"] for c in both.choices[0].message.tool_calls] == ["Paris", "Rome"]
    one = oai.chat.completions.create(**ask, parallel_tool_calls=False)
    assert [json.loads(c.function.arguments)["city"] for c in one.choices[0].message.tool_calls] == ["Paris"]
    assert one.choices[0].finish_reason == "tool_calls"


def test_responses_fields_and_store_false(oai, tiny_model):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["input_schema"]}
    kept = oai.responses.create(model=tiny_model, input="Weather?", tools=[tool], tool_choice="auto",
                                parallel_tool_calls=False, store=True, metadata={"task": "t1"}, user="u-1",
                                service_tier="auto", prompt_cache_key="codex-1", include=[], truncation="disabled",
                                reasoning={"effort": "low", "summary": "auto"}, max_output_tokens=400,
                                extra_body=forced(THEN_TWO_CALLS))
    assert [item.type for item in kept.output] == ["reasoning", "function_call"]
    assert kept.metadata == {"task": "t1"} and kept.parallel_tool_calls is False and kept.store is True
    assert oai.responses.retrieve(kept.id).id == kept.id
    gone = oai.responses.create(model=tiny_model, input="Hi", store=False, max_output_tokens=3,
                                include=["reasoning.encrypted_content"])
    assert gone.store is False
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(gone.id)


def test_claude_code_shapes_are_accepted(claude, app):
    tool = {**WEATHER, "cache_control": EPHEMERAL}
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?", "cache_control": EPHEMERAL}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "cache_control": EPHEMERAL,
                                      "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "21C"}]},
                                     {"type": "text", "text": "And Rome?"}]},
    ]
    shape = dict(model="m", max_tokens=400, messages=history, tools=[tool],
                 system=[{"type": "text", "text": "Agent.", "cache_control": EPHEMERAL}],
                 thinking={"type": "enabled", "budget_tokens": 1024},
                 metadata={"user_id": "user_abc_account_1_session_2"})
    betas = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "prompt-caching-2024-07-31"]
    msg = claude.beta.messages.create(**shape, betas=betas, tool_choice={"type": "auto"},
                                      extra_body=forced(THEN_TWO_CALLS))
    assert [b.type for b in msg.content] == ["thinking", "tool_use", "tool_use"]
    one = claude.beta.messages.create(**shape, betas=betas,
                                      tool_choice={"type": "auto", "disable_parallel_tool_use": True},
                                      extra_body=forced(THEN_TWO_CALLS))
    assert [b.input for b in one.content if b.type == "tool_use"] == [{"city": "Paris"}]
    assert one.stop_reason == "tool_use"
    counted = claude.beta.messages.count_tokens(model="m", messages=history, tools=[tool], betas=betas,
                                                system=shape["system"], thinking=shape["thinking"])
    assert counted.input_tokens > 0
    # Raw, as Claude Code posts it: ?beta=true, its headers, and fields this server has no use for.
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": ",".join(betas), "x-api-key": "k",
               "anthropic-dangerous-direct-browser-access": "true", "x-app": "cli"}
    body = {**shape, "stream": True, "service_tier": "auto", "context_management": {"edits": []},
            "tool_choice": {"type": "auto"}}
    with app.stream("POST", "/v1/messages?beta=true", json=body, headers=headers, timeout=60) as r:
        text = r.read().decode()
    assert r.status_code == 200 and "event: message_stop" in text
    assert r.headers["x-hearth-ignored-fields"] == "context_management"  # not read, and said so


def test_wire_details_real_clients_read(app, oai, tiny_model):
    """A user message without content is a 400 naming it; include_usage sends
    the usage in a chunk of its own with no choices; a Responses reply cut by
    max_output_tokens marks its message item incomplete too."""
    missing = app.post("/v1/chat/completions", timeout=30,
                         json={"model": tiny_model, "messages": [{"role": "user"}]})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages[0].content"
    chunks = list(oai.chat.completions.create(model=tiny_model, messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=5, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chunks[-2].choices[0].finish_reason and chunks[-2].usage is None
    plain = list(oai.chat.completions.create(model=tiny_model, messages=[{"role": "user", "content": "Hi"}],
                                             max_tokens=5, stream=True))
    assert plain[-1].choices and plain[-1].usage is not None  # without it, the usage rides on the last chunk
    bad = app.post("/v1/chat/completions", timeout=30, json={
        "model": tiny_model, "messages": [{"role": "user", "content": "Hi"}], "stream": True,
        "stream_options": {"include_usage": "yes"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stream_options.include_usage"
    cut = oai.responses.create(model=tiny_model, input="Hello", max_output_tokens=3,
                               extra_body={"logit_bias": {"2": -100}})
    assert cut.status == "incomplete" and cut.output[-1].status == "incomplete" and cut.output[-1].content
    with oai.responses.stream(model=tiny_model, input="Hello", max_output_tokens=3,
                              extra_body={"logit_bias": {"2": -100}}) as stream:
        done = [e.item for e in stream if e.type == "response.output_item.done"]
    assert done[-1].status == "incomplete"


# -- what coding agents write into tool arguments ------------------------------
EDIT_ARGS = {"path": "chat/template.jinja", "old": "{{ call }}",
             "new": 'x </tool_call> y "q" \\ <tool_call>{"name": "edit"}'}
EDIT_SCHEMA = {"type": "object", "properties": {k: {"type": "string"} for k in EDIT_ARGS}}
EDIT_CALL = '<tool_call>{"name": "edit", "arguments": ' + json.dumps(EDIT_ARGS) + "}</tool_call>"


def test_an_argument_holding_the_call_markup_is_kept_whole(oai, claude, tiny_model):
    """An agent editing a file that holds `</tool_call>` (a chat template, a
    tool parser) writes it inside a JSON string: the call ends at the end tag
    after its JSON, on every protocol, streamed or not."""
    ask = dict(max_tokens=400, extra_body=forced("Editing. " + EDIT_CALL))
    tool = {"type": "function", "function": {"name": "edit", "parameters": EDIT_SCHEMA}}
    message = oai.chat.completions.create(model=tiny_model, messages=[{"role": "user", "content": "Edit."}],
                                          tools=[tool], **ask).choices[0]
    assert message.finish_reason == "tool_calls" and message.message.content == "Editing. "
    assert json.loads(message.message.tool_calls[0].function.arguments) == EDIT_ARGS
    with oai.chat.completions.stream(model=tiny_model, messages=[{"role": "user", "content": "Edit."}],
                                     tools=[tool], **ask) as stream:
        final = stream.get_final_completion().choices[0]
    assert json.loads(final.message.tool_calls[0].function.arguments) == EDIT_ARGS

    claude_tool = {"name": "edit", "input_schema": EDIT_SCHEMA}
    msg = claude.messages.create(model="m", messages=[{"role": "user", "content": "Edit."}], tools=[claude_tool], **ask)
    assert [b.type for b in msg.content] == ["text", "tool_use"] and msg.content[1].input == EDIT_ARGS
    with claude.messages.stream(model="m", messages=[{"role": "user", "content": "Edit."}], tools=[claude_tool],
                                **ask) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and streamed.content[1].input == EDIT_ARGS

    flat = {"type": "function", "name": "edit", "parameters": EDIT_SCHEMA}
    ask = dict(max_output_tokens=400, extra_body=ask["extra_body"])
    reply = oai.responses.create(model=tiny_model, input="Edit.", tools=[flat], **ask)
    assert [i.type for i in reply.output] == ["message", "function_call"]
    assert json.loads(reply.output[1].arguments) == EDIT_ARGS
    with oai.responses.stream(model=tiny_model, input="Edit.", tools=[flat], **ask) as stream:
        sent = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        done = stream.get_final_response()
    assert json.loads(sent) == EDIT_ARGS and json.loads(done.output[1].arguments) == EDIT_ARGS


# -- tool turns and tool definitions an agent got wrong ------------------------
ASKED = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}]
CLAUDE_ASKED = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": [
    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]}]
FLAT_WEATHER = {"type": "function", "name": "get_weather", "parameters": WEATHER["input_schema"]}


def _openai_param(call) -> str:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    return caught.value.body["param"]


@pytest.mark.parametrize(("extra", "param"), [
    ({"messages": [*ASKED, {"role": "tool", "content": "Sunny"}]}, "messages[2].tool_call_id"),
    ({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": "city: string"}}]},
     "tools[0].function.parameters"),
    ({"tools": [OPENAI_WEATHER, OPENAI_WEATHER]}, "tools"),
])
def test_chat_tool_turns_and_tools_are_checked(oai, tiny_model, extra, param):
    ask = {"model": tiny_model, "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 2, **extra}
    assert _openai_param(lambda: oai.chat.completions.create(**ask)) == param


@pytest.mark.parametrize(("extra", "param"), [
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "output": "Sunny"}]}, "input[1].call_id"),
    ({"tools": [{**FLAT_WEATHER, "parameters": "city: string"}]}, "tools[0].parameters"),
    ({"tools": [FLAT_WEATHER, {"type": "web_search_preview"}], "tool_choice": {"type": "web_search_preview"}},
     "tool_choice"),
    ({"tools": [FLAT_WEATHER], "tool_choice": {"type": "allowed_tools", "mode": "required",
                                               "tools": [{"type": "function", "name": "get_weather"}]}},
     "tool_choice"),
])
def test_responses_tool_turns_and_choices_are_checked(oai, tiny_model, extra, param):
    """A choice of a tool that never runs here, or of a subset of the tools,
    is refused, not answered as `auto`."""
    ask = {"model": tiny_model, "input": "Weather?", "max_output_tokens": 2, **extra}
    assert _openai_param(lambda: oai.responses.create(**ask)) == param


@pytest.mark.parametrize(("extra", "needle"), [
    ({"messages": [*CLAUDE_ASKED, {"role": "user", "content": [{"type": "tool_result", "content": "Sunny"}]}]},
     "messages[2].content[0].tool_use_id required"),
    ({"tools": [{"name": "get_weather", "input_schema": "city: string"}]}, "tools[0].input_schema must be"),
    ({"tools": [WEATHER, WEATHER]}, "'get_weather' twice"),
])
def test_messages_tool_turns_and_tools_are_checked(claude, extra, needle):
    ask = {"model": "m", "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 2, **extra}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(**ask)
    assert needle in caught.value.body["error"]["message"]
