"""Nothing inside a request's objects is silently ignored either: a key no
SDK type has is a 400 naming its path, one the SDK has but Hearth does not
build is a 400 when it asks for something, and a harmless unread one is
named in X-Hearth-Ignored-Fields (through the official SDKs). Assistant
refusal parts are what the assistant said; embeddings name what they do
not read; Responses' stream_options needs a stream, as chat's does."""
from __future__ import annotations

import typing

import anthropic
import openai
import pytest

from inference.protocols import inner_fields

HI = [{"role": "user", "content": "Hi"}]
HEADER = "x-hearth-ignored-fields"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
FUNCTION = {"name": "f", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def app(served):
    return served()


@pytest.fixture(scope="module")
def oai(app):
    return app.openai()


def _openai_400(call, param: str, code: str = "unknown_parameter") -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    error = caught.value.body
    assert (error["param"], error["code"]) == (param, code), error
    if code == "unknown_parameter":
        assert error["message"] == f"Unknown parameter: '{param}'."


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_object", "foo": 1}}, "response_format.foo"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "foo": 1}}},
     "response_format.json_schema.foo"),
    ({"tools": [{"type": "function", "function": {**FUNCTION, "foo": 1}}]}, "tools[0].function.foo"),
    ({"tools": [{"type": "function", "function": FUNCTION, "foo": 1}]}, "tools[0].foo"),
    ({"tools": [{"type": "function", "function": FUNCTION}],
      "tool_choice": {"type": "function", "function": {"name": "f", "foo": 1}}}, "tool_choice.function.foo"),
    ({"messages": [{"role": "user", "content": "Hi", "foo": 1}]}, "messages[0].foo"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "foo": 1}]}]},
     "messages[0].content[0].foo"),
    ({"messages": [*HI, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}", "foo": 1}}]}]},
     "messages[1].tool_calls[0].function.foo"),
])
def test_chat_unknown_keys_inside_objects_are_400s(oai, tiny_model, extra, param):
    body = {"messages": HI, **extra}
    _openai_400(lambda: oai.chat.completions.create(model=tiny_model, max_tokens=2, messages=body.pop("messages"),
                                                    extra_body=body), param)


def test_chat_unbuilt_keys_refused_and_harmless_ones_named(oai, tiny_model):
    echoed = {"role": "assistant", "content": "Hello", "audio": {"id": "audio_1"}}
    _openai_400(lambda: oai.chat.completions.create(model=tiny_model, max_tokens=2, messages=[*HI, echoed, *HI]),
                "messages[1].audio", "unsupported_parameter")
    # A reply's message sent back as it came (nulls, annotations), cache breakpoints, a schema's description.
    echoed = {"role": "assistant", "content": "Hello", "audio": None, "function_call": None, "refusal": None,
              "annotations": []}
    raw = oai.chat.completions.with_raw_response.create(
        model=tiny_model, max_tokens=2, messages=[
            *HI, echoed, {"role": "user", "content": [{"type": "text", "text": "Go", "prompt_cache_breakpoint": {}}]}],
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True,
                                                                "description": "an a"}})
    assert raw.parse().choices[0].message.content.startswith("{")  # the schema's grammar holds
    assert raw.headers[HEADER] == "response_format.json_schema.description"
    completion = oai.completions.with_raw_response.create(model=tiny_model, prompt="Hi", max_tokens=2,
                                                          extra_body={"response_format": {"type": "text"}})
    assert HEADER not in completion.headers
    _openai_400(lambda: oai.completions.create(model=tiny_model, prompt="Hi", max_tokens=2, extra_body={
        "response_format": {"type": "text", "foo": 1}}), "response_format.foo")


def test_assistant_refusal_parts_are_what_the_assistant_said(oai, tiny_model):
    def prompt(assistant: dict) -> int:
        return oai.chat.completions.create(model=tiny_model, max_tokens=1, messages=[
            *HI, assistant, {"role": "user", "content": "Why?"}]).usage.prompt_tokens

    said = prompt({"role": "assistant", "content": "I can't help with that."})
    assert prompt({"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]}) \
        == said
    assert prompt({"role": "assistant", "content": None, "refusal": "I can't help with that."}) == said
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model=tiny_model, max_tokens=1, messages=[
            {"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}])
    assert caught.value.body["param"] == "messages[0].content[0]"
    assert "only allowed in assistant messages" in caught.value.body["message"]
    # Responses: an assistant output message sent back with its refusal part.
    done = oai.responses.create(model=tiny_model, max_output_tokens=1, input=[
        {"role": "user", "content": "Hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
        {"role": "user", "content": "Why?"}])
    assert done.status in ("completed", "incomplete")


@pytest.mark.parametrize("extra,param,code", [
    ({"text": {"foo": 1}}, "text.foo", "unknown_parameter"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA, "foo": 1}}}, "text.format.foo",
     "unknown_parameter"),
    ({"reasoning": {"effort": "low", "foo": 1}}, "reasoning.foo", "unknown_parameter"),
    ({"reasoning": {"effort": "low", "mode": "pro"}}, "reasoning.mode", "unsupported_parameter"),
    ({"tools": [{"type": "function", **FUNCTION, "defer_loading": True}]}, "tools[0].defer_loading",
     "unsupported_parameter"),
    ({"tools": [{"type": "function", **FUNCTION}], "tool_choice": {"type": "function", "name": "f", "foo": 1}},
     "tool_choice.foo", "unknown_parameter"),
])
def test_responses_keys_inside_objects(oai, tiny_model, extra, param, code):
    _openai_400(lambda: oai.responses.create(model=tiny_model, input="Hi", max_output_tokens=2, extra_body=extra),
                param, code)


def test_responses_harmless_inner_keys_are_named(oai, tiny_model):
    raw = oai.responses.with_raw_response.create(model=tiny_model, input="Hi", max_output_tokens=2,
                                                 reasoning={"effort": "low", "summary": "auto"})
    assert HEADER not in raw.headers
    raw = oai.responses.with_raw_response.create(model=tiny_model, input="Hi", max_output_tokens=2,
                                                 reasoning={"effort": "low", "summary": "detailed"})
    assert raw.headers[HEADER] == "reasoning.summary"


def test_responses_stream_options_need_a_stream(oai, tiny_model):
    for stream in ({}, {"stream": False}):
        with pytest.raises(openai.BadRequestError) as caught:
            oai.responses.create(model=tiny_model, input="Hi", max_output_tokens=2,
                                 stream_options={"include_obfuscation": False}, **stream)
        assert caught.value.body["param"] == "stream_options"
        assert caught.value.body["message"] == \
            "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    events = list(oai.responses.create(model=tiny_model, input="Hi", max_output_tokens=2, stream=True,
                                       stream_options={"include_obfuscation": False}))
    assert events[-1].type in ("response.completed", "response.incomplete")


def _anthropic_400(app, message: str, **extra) -> None:
    claude = app.anthropic()
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model="m", max_tokens=2, **{"messages": HI, **extra})
    assert caught.value.body["error"] == {"type": "invalid_request_error", "message": message}


@pytest.mark.parametrize("extra,path", [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024, "foo": 1}}, "thinking.foo"),
    ({"tool_choice": {"type": "auto", "foo": 1}}, "tool_choice.foo"),
    ({"metadata": {"user_id": "u", "foo": 1}}, "metadata.foo"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}, "foo": 1}]}, "tools[0].foo"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "foo": 1}]}]},
     "messages[0].content[0].foo"),
    ({"messages": [{"role": "user", "content": "Hi", "foo": 1}]}, "messages[0].foo"),
    ({"system": [{"type": "text", "text": "Be brief.", "foo": 1}]}, "system[0].foo"),
])
def test_messages_unknown_keys_inside_objects_are_400s(app, extra, path):
    _anthropic_400(app, f"Unknown parameter: '{path}'.", **extra)


def test_messages_unbuilt_and_harmless_inner_keys(app):
    _anthropic_400(app, "thinking.display is not supported: thinking comes back as the model wrote it",
                   thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"})
    claude = app.anthropic()
    citation = {"type": "char_location", "cited_text": "x", "document_index": 0, "document_title": None,
                "start_char_index": 0, "end_char_index": 1}
    raw = claude.messages.with_raw_response.create(
        model="m", max_tokens=2, thinking={"type": "enabled", "budget_tokens": 1024, "display": "summarized"},
        messages=[*HI, {"role": "assistant", "content": [
            {"type": "text", "text": "Hello", "citations": [citation], "cache_control": {"type": "ephemeral"}}]},
                  {"role": "user", "content": "Go on"}])
    assert raw.headers[HEADER] == "messages[1].content[0].citations"


def test_count_tokens_checks_inner_keys_too(app):
    claude = app.anthropic()
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.count_tokens(model="m", messages=HI, extra_body={"thinking": {"type": "disabled", "foo": 1}})
    assert caught.value.body["error"]["message"] == "Unknown parameter: 'thinking.foo'."


def test_embeddings_name_what_they_do_not_read(served):
    client = served("--embeddings").openai()
    raw = client.embeddings.with_raw_response.create(model="m", input="cats", encoding_format="float", user="u")
    assert raw.parse().data and HEADER not in raw.headers
    raw = client.embeddings.with_raw_response.create(model="m", input="cats", encoding_format="float",
                                                     extra_body={"truncate_prompt_tokens": 5})
    assert raw.headers[HEADER] == "truncate_prompt_tokens"
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="m", input="cats", dimensions=8)
    assert (caught.value.body["param"], caught.value.body["code"]) == ("dimensions", "unsupported_parameter")


def _hints(request_type) -> set[str]:
    return set(typing.get_type_hints(request_type))


def test_the_tables_name_the_sdks_keys():
    """Each table's keys are the installed SDK type's (a key missing there would be a 400 for what a client
    may send), beside the few a server reads more."""
    from anthropic.types import MetadataParam, TextBlockParam, ThinkingConfigEnabledParam, ToolParam
    from openai.types.chat import ChatCompletionAssistantMessageParam, ChatCompletionContentPartTextParam
    from openai.types.responses import FunctionToolParam, ResponseTextConfigParam
    from openai.types.shared_params import FunctionDefinition, Reasoning
    from openai.types.shared_params.response_format_json_schema import JSONSchema

    def keys(node) -> set[str]:
        return set(node.keys)

    chat, responses, messages = inner_fields.CHAT.inner, inner_fields.RESPONSES.inner, inner_fields.MESSAGES.inner
    assert keys(chat["messages"].item.kinds["assistant"]) == \
        _hints(ChatCompletionAssistantMessageParam) | {"reasoning_content", "reasoning", "annotations"}
    assert keys(chat["messages"].item.kinds["user"].inner["content"].item.kinds["text"]) == \
        _hints(ChatCompletionContentPartTextParam)
    assert keys(chat["response_format"].kinds["json_schema"].inner["json_schema"]) == \
        _hints(JSONSchema) | {"any_whitespace"}
    assert keys(chat["tools"].item.kinds["function"].inner["function"]) == _hints(FunctionDefinition)
    assert keys(responses["text"]) == _hints(ResponseTextConfigParam)
    assert keys(responses["reasoning"]) == _hints(Reasoning)
    assert keys(responses["tools"].item.kinds["function"]) == _hints(FunctionToolParam)
    assert keys(messages["metadata"]) == _hints(MetadataParam)
    assert keys(messages["thinking"].kinds["enabled"]) == _hints(ThinkingConfigEnabledParam)
    assert keys(messages["tools"].item.kinds["custom"]) == _hints(ToolParam)
    assert keys(messages["system"].item.kinds["text"]) == _hints(TextBlockParam)
