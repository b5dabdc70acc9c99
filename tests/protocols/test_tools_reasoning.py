"""Tool calls and the reasoning channel end to end. The random model is
steered with a grammar into exact tool-call markup, so the parser, the
wire shapes and the round trip are all exercised for real."""
import json

import httpx
import openai
import pytest

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "days": {"type": "integer"}},
                                                "required": ["city"]}}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'


def forced(text: str) -> str:
    return "root ::= " + json.dumps(text)


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)


def ask(client, grammar, **fields):
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
        max_tokens=120, extra_body={"guided_grammar": grammar, **fields.pop("extra_body", {})}, **fields)


def test_tool_call_comes_back_as_tool_calls(client):
    r = ask(client, forced(CALL))
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}


def test_content_before_the_call_is_kept(client):
    r = ask(client, forced("Checking. " + CALL))
    assert r.choices[0].message.content == "Checking. "
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_qwen_markup_and_schema_typed_arguments(client):
    markup = ("<tool_call><function=get_weather><parameter=city>\n007\n</parameter>"
              "<parameter=days>\n3\n</parameter></function></tool_call>")
    call = ask(client, forced(markup)).choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"city": "007", "days": 3}  # strings stay strings


def test_tool_choice_none_turns_parsing_off(client):
    r = ask(client, forced(CALL), tool_choice="none")
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == CALL
    assert r.choices[0].finish_reason == "stop"


def test_streamed_tool_call_delta_and_keepalives(base_url):
    # A long call: buffering lasts well past the 1 ms keep-alive interval of the
    # test server, even if the reader lags behind the engine for a while.
    city = "Llanfair" * 25
    long_call = CALL.replace("Paris", city)
    # Token by token (`speculative: false`): jump-forward would append the whole forced call at once.
    body = {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER], "stream": True,
            "max_tokens": 400, "guided_grammar": forced("Sure. " + long_call), "speculative": False}
    raw = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60).text
    frames = [f for f in raw.split("\n\n") if f]
    assert ": keep-alive" in frames  # the server under test sends them every millisecond of buffering
    chunks = [json.loads(f[6:]) for f in frames if f.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Sure. "
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    # not enforced, and still streamed: the name first, then the arguments as they are read
    assert len(calls) > 20 and {c["index"] for c in calls} == {0} and calls[0]["function"]["name"] == "get_weather"
    assert all("name" not in c.get("function", {}) for c in calls[1:])
    arguments = "".join(c["function"].get("arguments") or "" for c in calls)
    assert arguments == json.dumps({"city": city, "days": 2})
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("<tool_call>" not in (d.get("content") or "") for d in deltas)


def test_sdk_stream_accumulates_the_call(client):
    stream = ask(client, forced(CALL), stream=True)
    chunks = list(stream)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_round_trip_with_tool_results(client):
    first = ask(client, forced(CALL))
    call = first.choices[0].message.tool_calls[0]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], max_tokens=5)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were rendered
    streamed = list(client.chat.completions.create(model="m", messages=messages, tools=[WEATHER],
                                                   max_tokens=5, stream=True))
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("fields,param", [
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
])
def test_bad_tool_and_reasoning_fields(inproc, fields, param):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, **fields}
    r = inproc.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_reasoning_effort_message_is_exact(inproc):
    body = {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"}
    message = inproc.post("/v1/chat/completions", json=body).json()["error"]["message"]
    assert message == "reasoning_effort must be one of 'none', 'minimal', 'low', 'medium', 'high', 'xhigh'"


def test_thinking_routes_text_to_reasoning(client):
    thought = forced("Paris is in France.</think>\n\nIt is sunny.")
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                       max_tokens=60, extra_body={"guided_grammar": thought,
                                                                  "chat_template_kwargs": {"enable_thinking": True}})
    message = r.choices[0].message
    assert message.reasoning == "Paris is in France." and message.content == "It is sunny."


def test_streamed_reasoning_deltas(base_url):
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 60,
            "reasoning_effort": "high", "guided_grammar": forced("Greet back.</think>\n\nHello!")}
    raw = httpx.post(base_url + "/v1/chat/completions", json=body).text
    deltas = [json.loads(f[6:])["choices"][0]["delta"] for f in raw.split("\n\n") if f.startswith("data: {")]
    assert "".join(d.get("reasoning", "") for d in deltas) == "Greet back."
    assert "".join(d.get("content", "") for d in deltas) == "Hello!"


def test_reasoning_effort_none_and_explicit_switch_win(client):
    def prompt_tokens(**extra):
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=1, extra_body=extra).usage.prompt_tokens

    off = prompt_tokens(reasoning_effort="none")
    on = prompt_tokens(reasoning_effort="low")
    assert on != off  # "low" left <think> open; "none" rendered an empty, closed block
    assert prompt_tokens(reasoning_effort="low", chat_template_kwargs={"enable_thinking": False}) == off
    assert prompt_tokens() == off  # thinking is off unless asked for


def test_reasoning_alias_in_history_reaches_the_template(client):
    # The tiny model's template renders reasoning_content (see TEMPLATE_PROBE).
    def tokens(assistant):
        messages = [{"role": "user", "content": "Hi"}, assistant, {"role": "user", "content": "Again"}]
        return client.chat.completions.create(model="m", messages=messages, max_tokens=1).usage.prompt_tokens

    plain = tokens({"role": "assistant", "content": "Hello"})
    aliased = tokens({"role": "assistant", "content": "Hello", "reasoning": "a long chain of thought"})
    explicit = tokens({"role": "assistant", "content": "Hello", "reasoning": "a long chain of thought",
                       "reasoning_content": ""})
    assert aliased > plain and explicit == plain


def test_reasoning_effort_maps_into_a_templates_depth_variable():
    """On templates with a reasoning-depth variable, the level maps into it
    (minimal/low -> low, medium -> medium, high/xhigh -> xhigh; a template
    that knows no xhigh gets high); an explicit value and other templates are left alone."""
    from inference.protocols.chat import with_depth

    deep = "{% if reasoning_effort %}Think {{ reasoning_effort }} (low, medium or xhigh){% endif %}"
    plain_levels = "Reasoning: {{ reasoning_depth | default('medium') }}"
    expected = {"minimal": "low", "low": "low", "medium": "medium", "high": "xhigh", "xhigh": "xhigh"}
    for effort, level in expected.items():
        assert with_depth({}, effort, deep) == {"reasoning_effort": level}
        assert with_depth({}, effort, plain_levels) == {"reasoning_depth": level.replace("xhigh", "high")}
    assert with_depth({}, "none", deep) == {}
    assert with_depth({"reasoning_effort": "low"}, "xhigh", deep) == {"reasoning_effort": "low"}
    assert with_depth({}, "high", "{% for m in messages %}{{ m.content }}{% endfor %}") == {}
    assert with_depth({}, "high", "{% if %}") == {}  # a template that does not parse


def test_enforced_calls_stream_their_arguments_in_pieces_on_every_protocol(base_url, tiny_model):
    """Under an enforced tool_choice the arguments are schema-valid JSON as
    they are written, so they stream as generated: OpenAI arguments pieces,
    Anthropic input_json_delta, Responses function_call_arguments.delta; put
    together, each is the call's arguments."""
    from huggingface_hub import snapshot_download
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(snapshot_download(tiny_model, local_files_only=True) + "/tokenizer.json")
    quiet = {str(i): -100 for i in range(tok.get_vocab_size()) if not tok.decode([i]).strip()}
    # A city of 40 characters at least: the model writes it token by token, so on a fast machine too its
    # arguments take longer than a stream's 8 ms pace and come in several pieces (an empty city did not).
    params = {"type": "object", "properties": {"city": {"type": "string", "minLength": 40, "maxLength": 60},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["city", "days"], "additionalProperties": False}

    def valid(text: str) -> bool:
        args = json.loads(text)
        return set(args) == {"city", "days"} and isinstance(args["days"], int)

    ask = [{"role": "user", "content": "Weather?"}]
    raw = httpx.post(base_url + "/v1/chat/completions", timeout=120, json={
        "model": tiny_model, "messages": ask, "stream": True, "max_tokens": 300, "logit_bias": quiet,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": params}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}).text
    calls = [tc for f in raw.split("\n\n") if f.startswith("data: {")
             for tc in json.loads(f[6:])["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather" and len(calls) > 2
    assert valid("".join(c["function"]["arguments"] for c in calls))

    raw = httpx.post(base_url + "/v1/messages", timeout=120, json={
        "model": tiny_model, "max_tokens": 300, "stream": True, "messages": ask, "logit_bias": quiet,
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": params}],
        "tool_choice": {"type": "tool", "name": "get_weather"}})
    if raw.status_code == 400:  # logit_bias is not part of the Messages protocol: ask without it
        raw = httpx.post(base_url + "/v1/messages", timeout=120, json={
            "model": tiny_model, "max_tokens": 600, "stream": True, "messages": ask,
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": params}],
            "tool_choice": {"type": "tool", "name": "get_weather"}})
    events = [json.loads(line[6:]) for line in raw.text.splitlines() if line.startswith("data: ")]
    pieces = [e["delta"]["partial_json"] for e in events if e.get("delta", {}).get("type") == "input_json_delta"]
    assert len(pieces) > 2 and valid("".join(pieces))

    raw = httpx.post(base_url + "/v1/responses", timeout=120, json={
        "model": tiny_model, "max_output_tokens": 300, "stream": True, "input": "Weather?", "logit_bias": quiet,
        "tools": [{"type": "function", "name": "get_weather", "parameters": params}], "tool_choice": "required"}).text
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    pieces = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert len(pieces) > 2 and "".join(pieces) == done["arguments"] and valid(done["arguments"])


def test_the_servers_thinking_default_yields_to_the_request(served, tiny_model):
    """`--thinking on|off` is enable_thinking for a request that does not say;
    the tiny model's template opens <think> only when it is on."""
    body = {"model": tiny_model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}

    def thought(app, **fields) -> bool:
        message = app.post("/v1/chat/completions", json={**body, **fields}).json()["choices"][0]["message"]
        return bool(message.get("reasoning"))

    on = served("--no-worker", "--thinking", "on")
    assert thought(on) and not thought(on, reasoning_effort="none")
    assert not thought(on, chat_template_kwargs={"enable_thinking": False})
    off = served("--no-worker", "--thinking", "off")
    assert not thought(off) and thought(off, chat_template_kwargs={"enable_thinking": True})
    auto = served("--no-worker")
    assert not thought(auto)  # this template's own default: no thinking
