"""tool_choice enforced by a grammar over the model's tool-call markup
(xgrammar's structural tag for the family), on the random tiny model: a
named choice comes back as exactly that call with schema-valid arguments,
`required` as a call to an offered tool, on every protocol; a call to a
tool nobody offered never reaches the client as a call."""
from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}}}
PERSON = {"type": "function", "function": {"name": "Person", "description": "A person", "parameters": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                     "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Tell me about Ann, who is 31."}]


@pytest.fixture(scope="module")
def quiet(tiny_model):
    """logit_bias that keeps the random model from padding JSON with whitespace."""
    from huggingface_hub import snapshot_download
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(snapshot_download(tiny_model, local_files_only=True) + "/tokenizer.json")
    return {str(i): -100 for i in range(tok.get_vocab_size()) if not tok.decode([i]).strip()}


def _valid_person(arguments: str) -> bool:
    args = json.loads(arguments)
    return set(args) == {"name", "age"} and isinstance(args["age"], int) and 0 <= args["age"] <= 120


@pytest.mark.parametrize("seed", range(6))
def test_a_named_choice_is_that_call_with_valid_arguments(base_url, tiny_model, quiet, seed):
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.with_raw_response.create(
        model=tiny_model, messages=ASK, tools=[ADD, PERSON], max_tokens=300, temperature=1.0, seed=seed,
        tool_choice={"type": "function", "function": {"name": "Person"}}, extra_body={"logit_bias": quiet})
    assert "warning" not in r.headers
    choice = r.parse().choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "Person" and _valid_person(call.function.arguments)
    assert choice.finish_reason == "tool_calls"


@pytest.mark.parametrize("seed", range(4))
def test_required_makes_a_call_to_an_offered_tool(base_url, tiny_model, quiet, seed):
    body = {"model": tiny_model, "messages": ASK, "tools": [ADD, PERSON], "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 300, "temperature": 1.0, "seed": seed, "logit_bias": quiet}
    choice = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
    (call,) = choice["message"]["tool_calls"]  # parallel_tool_calls false: one call
    assert call["function"]["name"] in ("add", "Person")
    if choice["finish_reason"] == "length":  # a random number ran to the limit: the call was cut (test_cut_calls)
        return
    assert choice["finish_reason"] == "tool_calls"
    args = json.loads(call["function"]["arguments"])
    assert _valid_person(call["function"]["arguments"]) if call["function"]["name"] == "Person" else (
        set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values()))


def test_anthropic_and_responses_forced_choices(base_url, tiny_model, quiet):
    claude = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
    person = {"name": "Person", "description": "A person", "input_schema": PERSON["function"]["parameters"]}
    add = {"name": "add", "description": "Add", "input_schema": ADD["function"]["parameters"]}
    msg = claude.messages.create(model=tiny_model, max_tokens=600, messages=ASK, tools=[add, person],
                                 tool_choice={"type": "tool", "name": "Person"}, extra_body={"temperature": 1.0})
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert [u.name for u in uses] == ["Person"] and msg.stop_reason == "tool_use"
    assert _valid_person(json.dumps(uses[0].input))
    oai = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
    flat = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
            for t in (ADD, PERSON)]
    reply = oai.responses.create(model=tiny_model, input="Ann is 31.", tools=flat, tool_choice="required",
                                 max_output_tokens=300, extra_body={"logit_bias": quiet})
    calls = [item for item in reply.output if item.type == "function_call"]
    assert calls and all(c.name in ("add", "Person") for c in calls)


@pytest.mark.parametrize("cut", [2, 5, 9])
def test_a_forced_call_cut_by_max_tokens_leaves_no_markup_in_content(base_url, tiny_model, quiet, cut):
    body = {"model": tiny_model, "messages": ASK, "tools": [ADD, PERSON], "max_tokens": cut, "logit_bias": quiet,
            "tool_choice": {"type": "function", "function": {"name": "Person"}}}
    for stream in (False, True):
        r = httpx.post(base_url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=60)
        if stream:
            chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        else:
            choice = r.json()["choices"][0]
            content, finish = choice["message"]["content"] or "", choice["finish_reason"]
        assert "<tool_call>" not in content and "name" not in content, content
        assert finish == "length", (stream, finish)


def test_a_named_choice_must_be_offered(base_url, tiny_model):
    r = httpx.post(base_url + "/v1/chat/completions", timeout=30, json={
        "model": tiny_model, "messages": ASK, "tools": [ADD],
        "tool_choice": {"type": "function", "function": {"name": "Person"}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice" and "Person" in r.text


def test_a_call_to_a_tool_nobody_offered_stays_text(base_url, tiny_model):
    """Steered (a grammar) to call `delete_everything`, which was not offered:
    the client gets the markup as text, not a tool call."""
    markup = '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>'
    r = httpx.post(base_url + "/v1/chat/completions", timeout=60, json={
        "model": tiny_model, "messages": ASK, "tools": [ADD], "max_tokens": 200,
        "guided_grammar": "root ::= " + json.dumps(markup)}).json()
    message = r["choices"][0]["message"]
    assert not message.get("tool_calls") and "delete_everything" in message["content"]
    assert r["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("seed", range(3))
def test_strict_tools_are_enforced_under_auto(base_url, tiny_model, quiet, seed):
    """`auto` leaves the model free to answer in text, but with a strict tool a
    call it starts must be well-formed and schema-valid."""
    strict = {**PERSON, "function": {**PERSON["function"], "strict": True}}
    r = httpx.post(base_url + "/v1/chat/completions", timeout=120, json={
        "model": tiny_model, "messages": ASK, "tools": [strict], "tool_choice": "auto", "max_tokens": 200,
        "temperature": 1.0, "seed": seed, "logit_bias": quiet})
    assert r.status_code == 200 and "warning" not in r.headers
    for call in r.json()["choices"][0]["message"].get("tool_calls") or []:
        assert call["function"]["name"] == "Person" and _valid_person(call["function"]["arguments"])


@pytest.mark.parametrize("seed", range(3))
def test_a_forced_call_comes_after_a_bounded_think_block(base_url, tiny_model, quiet, seed):
    """The template opens <think> (enable_thinking): a random model never
    closes it by itself, so without a bound it would think until max_tokens.
    The block closes after min(512, max_tokens / 2) tokens, then the call comes."""
    body = {"model": tiny_model, "messages": ASK, "tools": [ADD, PERSON], "max_tokens": 200, "temperature": 1.0,
            "seed": seed, "logit_bias": quiet, "tool_choice": {"type": "function", "function": {"name": "Person"}},
            "chat_template_kwargs": {"enable_thinking": True}}
    choice = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "Person" and _valid_person(call["function"]["arguments"])
    assert choice["message"].get("reasoning") and choice["finish_reason"] == "tool_calls"


def test_a_thinking_budget_bounds_the_block_on_both_apis(base_url, tiny_model, quiet):
    body = {"model": tiny_model, "messages": ASK, "max_tokens": 40, "logit_bias": quiet,
            "chat_template_kwargs": {"enable_thinking": True}}
    unbounded = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
    assert unbounded["finish_reason"] == "length" and not unbounded["message"]["content"]  # thought throughout
    bounded = httpx.post(base_url + "/v1/chat/completions", json={**body, "thinking_budget": 6},
                         timeout=60).json()
    message = bounded["choices"][0]["message"]
    assert message.get("reasoning") and message["content"], message
    refused = httpx.post(base_url + "/v1/chat/completions", json={**body, "thinking_budget": -1}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "thinking_budget"

    claude = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
    msg = claude.messages.create(model=tiny_model, max_tokens=40, messages=ASK,
                                 thinking={"type": "enabled", "budget_tokens": 6})
    assert msg.content[0].type == "thinking" and "text" in [b.type for b in msg.content], msg.content
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        claude.messages.create(model=tiny_model, max_tokens=40, messages=ASK,
                               thinking={"type": "enabled", "budget_tokens": "many"})


def test_thinking_switched_off_closes_a_block_the_template_opens_regardless(served, tiny_model):
    """A client template that opens <think> whatever enable_thinking says:
    `reasoning_effort: none` still reaches generation, as a budget of 0 (the
    block closes at once, before a forced call too)."""
    app = served("--no-worker", "--allow-client-templates")
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n<think>\n")
    body = {"model": tiny_model, "messages": ASK, "max_tokens": 24, "temperature": 0,
            "chat_template_kwargs": {"chat_template": template}}
    thinking = app.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert thinking.get("reasoning") and not thinking["content"]  # the block runs to max_tokens
    off = app.post("/v1/chat/completions", json={**body, "reasoning_effort": "none"}).json()["choices"][0]
    assert not off["message"].get("reasoning") and off["message"]["content"], off
    forced = app.post("/v1/chat/completions", json={**body, "reasoning_effort": "none", "max_tokens": 200,
                                                    "tools": [PERSON], "tool_choice": "required"}).json()
    assert forced["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "Person", forced


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"tool_choice": "required"}),
    ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": {"name": "add"}}}),
    ("/v1/chat/completions", {"tool_choice": "required", "tools": []}),
    ("/v1/responses", {"tool_choice": "required"}),
    ("/v1/responses", {"tool_choice": {"type": "function", "name": "add"}}),
    ("/v1/messages", {"tool_choice": {"type": "any"}}),
    ("/v1/messages", {"tool_choice": {"type": "tool", "name": "add"}}),
])
def test_a_choice_that_asks_for_a_call_needs_tools(inproc, path, body):
    """Without tools, a choice that demands a call cannot be met: a 400 naming
    tool_choice, in each protocol's own error shape. `auto` and `none` need none."""
    if path == "/v1/responses":
        body = {**body, "input": "hi", "max_output_tokens": 3}
    else:
        body = {**body, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    r = inproc.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()
    if path == "/v1/messages":
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    else:
        assert err["error"]["param"] == "tool_choice" and err["error"]["type"] == "invalid_request_error"
    assert "tool_choice asks for a tool call, but the request offers no function tools" in err["error"]["message"]
    for free in ("auto", "none"):
        choice = {"type": free} if path == "/v1/messages" else free
        assert inproc.post(path, json={**body, "tool_choice": choice}).status_code == 200


def test_a_prefill_takes_no_enforced_tool_choice(inproc):
    """A continued assistant message is not the start of a reply, where an enforced choice's grammar begins."""
    strict = {**PERSON, "function": {**PERSON["function"], "strict": True}}
    prefilled = [*ASK, {"role": "assistant", "content": "Ann"}]
    for fields, param in (({"tools": [PERSON], "tool_choice": "required"}, "tool_choice"),
                          ({"tools": [strict]}, "tools")):
        r = inproc.post("/v1/chat/completions", json={"messages": prefilled, "max_tokens": 3,
                                                      "continue_final_message": True, **fields})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
