"""gpt-oss's harmony format on a random-weight gpt_oss built here (a
tokenizer with harmony's special tokens): prompts written from the spec
(checked against the spec's own example, byte for byte), replies read into
reasoning, content and tool calls on every surface, streamed or not, and
`tool_choice` enforced with xgrammar's harmony tag. In this process."""
from __future__ import annotations

import datetime
import json

import pytest

from inference.protocols import harmony
from inference.protocols.errors import RequestError
from tests.helpers import HARMONY_REPO, build_harmony_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}'


def forced(text: str) -> dict:
    return {"guided_grammar": "root ::= " + json.dumps(text)}


@pytest.fixture(scope="module")
def app(homes, served):
    build_harmony_model(homes[0] / "hub")
    return served(model=HARMONY_REPO)


# The spec's example of a system and developer message with tools (openai/harmony, docs/format.md), as its
# renderer writes it.
SPEC_EXAMPLE = """<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06
Current date: 2025-06-28

Reasoning: high

# Valid channels: analysis, commentary, final. Channel must be included for every message.
Calls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions

Use a friendly tone.

# Tools

## functions

namespace functions {

// Gets the location of the user.
type get_location = () => any;

// Gets the current weather in the provided location.
type get_current_weather = (_: {
// The city and state, e.g. San Francisco, CA
location: string,
format?: "celsius" | "fahrenheit", // default: celsius
}) => any;

// A function with various complex schemas.
type kitchensink = (_: // params object
{
// STRING
//
// A string
// Examples:
// - "hello"
// - "world"
string?: string,
// A nullable string
string_nullable?: string | null, // default: "the default"
string_enum?: "a" | "b" | "c",
// a oneof
// default: 20
oneof_string_or_number?:
 | string // default: "default_string_in_oneof"
 | number // numbers can happen too
,
}) => any;

} // namespace functions<|end|><|start|>user<|message|>What is the weather like in SF?<|end|><|start|>assistant"""


def test_the_prompt_is_the_specs():
    weather = {"type": "object", "required": ["location"], "properties": {
        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
        "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}}}
    sink = {"description": "params object", "type": "object", "properties": {
        "string": {"type": "string", "title": "STRING", "description": "A string", "examples": ["hello", "world"]},
        "string_nullable": {"type": "string", "nullable": True, "description": "A nullable string",
                            "default": "the default"},
        "string_enum": {"type": "string", "enum": ["a", "b", "c"]},
        "oneof_string_or_number": {"oneOf": [{"type": "string", "default": "default_string_in_oneof"},
                                             {"type": "number", "description": "numbers can happen too"}],
                                   "description": "a oneof", "default": 20}}}
    tools = [{"type": "function", "function": {"name": "get_location",
                                               "description": "Gets the location of the user."}},
             {"type": "function", "function": {"name": "get_current_weather", "parameters": weather,
                                               "description": "Gets the current weather in the provided location."}},
             {"type": "function", "function": {"name": "kitchensink", "parameters": sink,
                                               "description": "A function with various complex schemas."}}]
    messages = [{"role": "system", "content": "Use a friendly tone."},
                {"role": "user", "content": "What is the weather like in SF?"}]
    assert harmony.render(messages, tools, "high", datetime.date(2025, 6, 28)) == SPEC_EXAMPLE


def test_history_keeps_analysis_only_while_the_model_works_through_calls():
    call = {"id": "c1", "type": "function", "function": {"name": "lookup_weather", "arguments": {"location": "SF"}}}
    messages = [{"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "simple"},
                {"role": "user", "content": "Weather in SF?"},
                {"role": "assistant", "content": "", "reasoning_content": "use the tool", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": '{"sunny": true}'}]
    text = harmony.render(messages, None, "medium", datetime.date(2025, 6, 28))
    turns = text.split("<|end|>", 1)[1]  # after the system message
    assert turns == (
        "<|start|>user<|message|>What is 2 + 2?<|end|>"
        "<|start|>assistant<|channel|>final<|message|>4<|end|>"  # a finished turn's reasoning is dropped
        "<|start|>user<|message|>Weather in SF?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>use the tool<|end|>"
        '<|start|>assistant to=functions.lookup_weather<|channel|>commentary <|constrain|>json<|message|>'
        '{"location": "SF"}<|call|>'
        '<|start|>functions.lookup_weather to=assistant<|channel|>commentary<|message|>{"sunny": true}<|end|>'
        "<|start|>assistant")


def test_the_reader_turns_channels_into_reasoning_content_and_calls():
    reader = harmony.Reader()
    reply = (ANALYSIS + "<|start|>assistant<|channel|>final<|message|>Sunny.<|end|>" + CALL)
    text = "".join(reader.feed(reply[i:i + 3]) for i in range(0, len(reply), 3)) + reader.finish()
    assert text == ('<think>The user wants the weather.</think>Sunny.'
                    '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')


def test_a_call_cut_by_the_token_limit_is_read_as_cut():
    from inference.protocols.output import OutputParser

    parser = OutputParser(reasoning=True, tools=[WEATHER], harmony=harmony.Reader())
    pieces = parser.feed(ANALYSIS + CALL[:-6])  # ... {"city": "
    pieces += parser.finish(cut=True)
    # Read as a cut call, as a `<tool_call>` cut there is: its arguments as written, no closing brace
    # of the markup inside them, nothing of it in the text.
    assert [(p.kind, p.text) for p in pieces] == [("reasoning", "The user wants the weather.")]
    (call,) = parser.calls  # its name was out: a streamed call, recorded as cut
    assert call.name == "get_weather" and call.cut and call.arguments == '{"city": "'
    whole = OutputParser(reasoning=True, tools=[WEATHER], harmony=harmony.Reader())
    whole.feed(ANALYSIS + CALL)
    whole.finish()  # stopped by <|call|>, which is never shown: the call is whole
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [("get_weather", {"city": "Rome"})]


def test_a_reply_reads_as_reasoning_and_content_on_every_surface(app):
    reply = ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is sunny."
    client = app.openai()
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                          max_tokens=200, extra_body=forced(reply))
    message = chat.choices[0].message
    assert message.content == "It is sunny." and chat.choices[0].finish_reason == "stop"
    assert message.reasoning == "The user wants the weather."
    streamed = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                                   max_tokens=200, stream=True, extra_body=forced(reply)))
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    assert "".join(d.content or "" for d in deltas) == "It is sunny."
    assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == \
        "The user wants the weather."
    response = client.responses.create(model="m", input="Weather?", max_output_tokens=200,
                                       reasoning={"effort": "high"}, extra_body=forced(reply))
    assert [i.type for i in response.output] == ["reasoning", "message"] and response.output_text == "It is sunny."
    claude = app.anthropic().messages.create(model="m", max_tokens=200, extra_body=forced(reply),
                                             messages=[{"role": "user", "content": "Weather?"}])
    assert [b.type for b in claude.content] == ["thinking", "text"] and claude.content[1].text == "It is sunny."


def test_a_call_on_the_commentary_channel_is_a_tool_call(app):
    client = app.openai()
    reply = ANALYSIS + CALL
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Rome?"}],
                                          tools=[WEATHER], max_tokens=200, extra_body=forced(reply))
    (call,) = chat.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Rome"}
    assert chat.choices[0].finish_reason == "tool_calls" and not chat.choices[0].message.content
    streamed = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Rome?"}],
                                                   tools=[WEATHER], max_tokens=200, stream=True,
                                                   extra_body=forced(reply)))
    calls = [d for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in calls)) == {"city": "Rome"}


def test_tool_choice_is_enforced_with_the_harmony_grammar(app):
    """The random model, made to call: the call comes at once, to the named tool, with arguments its schema takes."""
    client = app.openai()
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                              tools=[WEATHER], tool_choice=choice, max_tokens=120)
        (call,) = chat.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
        assert "warning" not in chat.model_extra


def test_reasoning_effort_sets_the_system_messages_level(app):
    from hearth.root import RUNTIME
    from inference.protocols import chat

    model = RUNTIME.engine.loaded_model
    assert chat.thinks(model) and harmony.is_harmony(model.tokenizer)
    for asked, level in ((None, "medium"), ("high", "high"), ("none", "low"), ("minimal", "low")):
        tokens, think = chat.build_prompt(model, [{"role": "user", "content": "Hi"}], None,
                                          {"reasoning_effort": harmony.effort({"reasoning_effort": asked}
                                                                              if asked else {})})
        assert f"Reasoning: {level}\n" in model.tokenizer.decode(tokens) and think is None
    assert harmony.effort({}, budget=20000) == "high" and harmony.effort({"enable_thinking": False}) == "low"
    with pytest.raises(RequestError):
        harmony.effort({"reasoning_effort": {"not": "a level"}})
    assert {365, 366} <= model.tokenizer.eos_token_ids or {model.tokenizer.convert_tokens_to_ids(t) for t in (
        harmony.RETURN, harmony.CALL)} <= model.tokenizer.eos_token_ids


def test_a_prefill_continues_the_final_channel(app):
    """An assistant message to continue (Anthropic's prefill, chat's
    continue_final_message) is left open on the final channel; the reply is its text going on."""
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "It is"}]
    text = harmony.render(messages, None, "low", datetime.date(2025, 6, 28), continued=True)
    assert text.endswith("<|start|>user<|message|>Weather?<|end|><|start|>assistant<|channel|>final<|message|>It is")
    claude = app.anthropic().messages.create(model="m", max_tokens=40, messages=messages,
                                             extra_body=forced(" sunny."))
    assert [b.type for b in claude.content] == ["text"] and claude.content[0].text == " sunny."
    chat = app.openai().chat.completions.create(model="m", messages=messages, max_tokens=40,
                                                extra_body={"continue_final_message": True, **forced(" sunny.")})
    assert chat.choices[0].message.content == " sunny."
