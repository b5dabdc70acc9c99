"""Nothing inside a request's objects is silently ignored either: a key no
SDK type has is a 400 naming its path, one the SDK has but Hearth does not
build is a 400 when it asks for something, and a harmless unread one is
named in X-Hearth-Ignored-Fields (through the official SDKs), in Responses'
input items and their parts too, while a response's output items sent back
as they came pass without a word. Assistant refusal parts are what the
assistant said; embeddings name what they do not read; Responses'
stream_options needs a stream, as chat's does."""
from __future__ import annotations

import json
import typing

import anthropic
import openai
import pytest

from inference.protocols import inner_fields

HI = [{"role": "user", "content": "Hi"}]
HEADER = "x-hearth-ignored-fields"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
FUNCTION = {"name": "f", "parameters": {"type": "object", "properties": {}}}
PNG, WAV = "data:image/png;base64,iVBORw0KGgo=", "data:audio/wav;base64,UklGRg=="


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
])
def test_chat_unknown_keys_inside_objects_are_400s(oai, tiny_model, extra, param):
    _openai_400(lambda: oai.chat.completions.create(model=tiny_model, max_tokens=2, messages=HI, extra_body=extra),
                param)


@pytest.mark.parametrize("messages,param", [
    ([{"role": "user", "content": "Hi", "foo": 1}], "messages[0].foo"),
    ([{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]}],
     "messages[0].content[0].cache_control"),
    ([*HI, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}", "foo": 1}}]}, *HI],
     "messages[1].tool_calls[0].function.foo"),
])
def test_chat_messages_keys_of_their_own_are_named_not_refused(oai, tiny_model, messages, param):
    """Clients send a chat's messages back as their SDK or framework holds them, with keys of their own (as
    OpenAI's chat endpoint takes them): named in the header, not refused."""
    raw = oai.chat.completions.with_raw_response.create(model=tiny_model, max_tokens=2, messages=messages)
    assert raw.parse().choices and raw.headers[HEADER] == param


def test_the_sdks_parse_and_stream_helpers_messages_go_back_as_they_came(oai, tiny_model):
    """openai's parse() and stream() helpers give a message with `parsed` (and a call's `parsed_arguments`),
    which the SDK sends as it is when the message is put back into the conversation."""
    import pydantic

    class A(pydantic.BaseModel):
        a: bool

    parsed = oai.chat.completions.parse(model=tiny_model, max_tokens=48, messages=HI, response_format=A)
    message = parsed.choices[0].message
    again = oai.chat.completions.with_raw_response.create(model=tiny_model, max_tokens=2,
                                                          messages=[*HI, message, *HI])
    assert again.parse().choices and HEADER not in again.headers
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "f", "arguments": "{}", "parsed_arguments": {}}}], "parsed": None}
    again = oai.chat.completions.with_raw_response.create(model=tiny_model, max_tokens=2, messages=[
        *HI, call, {"role": "tool", "tool_call_id": "c1", "content": "done"}])
    assert again.parse().choices and HEADER not in again.headers


@pytest.mark.parametrize("part,param", [
    ({"type": "input_text", "text": "Hi", "foo": 1}, "messages[0].content[0].foo"),
    ({"type": "image", "url": PNG, "foo": 1}, "messages[0].content[0].foo"),
    ({"type": "image", "image_url": {"url": PNG, "foo": 1}}, "messages[0].content[0].image_url.foo"),
    ({"type": "input_image", "image_url": PNG, "foo": 1}, "messages[0].content[0].foo"),
    ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA", "foo": 1}},
     "messages[0].content[0].video_url.foo"),
    ({"type": "video", "data": "AAAA", "foo": 1}, "messages[0].content[0].foo"),
    ({"type": "audio", "data": "UklGRg==", "foo": 1}, "messages[0].content[0].foo"),
    ({"type": "audio_url", "audio_url": {"url": WAV, "foo": 1}}, "messages[0].content[0].audio_url.foo"),
])
def test_chat_part_aliases_are_checked_too(part, param):
    """The parts the chat reader takes beyond OpenAI's types (Responses' parts, other servers' aliases): a key
    they do not have is named (the walk itself: the part's media then needs a model this one is not)."""
    assert inner_fields.check({"messages": [{"role": "user", "content": [part]}]}, inner_fields.CHAT) == [param]


def test_chat_takes_responses_parts_as_they_come(oai, tiny_model):
    raw = oai.chat.completions.with_raw_response.create(model=tiny_model, max_tokens=2, messages=[
        {"role": "user", "content": [{"type": "input_text", "text": "Hi", "prompt_cache_breakpoint": {}}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello", "annotations": [],
                                           "logprobs": []}]},
        {"role": "user", "content": "Go on"}])
    assert raw.parse().choices and HEADER not in raw.headers
    by_id = {"type": "input_image", "image_url": PNG, "file_id": "file_1"}
    _openai_400(lambda: oai.chat.completions.create(model=tiny_model, max_tokens=2, messages=[
        {"role": "user", "content": [by_id]}]), "messages[0].content[0].file_id", "unsupported_parameter")


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


CALL_ITEM = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
ASKED = [*HI, CALL_ITEM]


@pytest.mark.parametrize("input_,param,code", [
    ([{"role": "user", "content": "Hi", "foo": 1}], "input[0].foo", "unknown_parameter"),
    ([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi", "foo": 1}]}],
     "input[0].content[0].foo", "unknown_parameter"),
    ([*HI, {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "Hello", "annotations": [], "foo": 1}]}, *HI], "input[1].content[0].foo",
     "unknown_parameter"),
    ([*HI, {**CALL_ITEM, "foo": 1}], "input[1].foo", "unknown_parameter"),
    ([*HI, {**CALL_ITEM, "namespace": "crm"}], "input[1].namespace", "unsupported_parameter"),
    ([*HI, {**CALL_ITEM, "caller": {"type": "program", "caller_id": "p1"}}], "input[1].caller",
     "unsupported_parameter"),
    ([*ASKED, {"type": "function_call_output", "call_id": "c1", "output": "ok", "foo": 1}], "input[2].foo",
     "unknown_parameter"),
    ([*ASKED, {"type": "function_call_output", "call_id": "c1", "output": [
        {"type": "input_text", "text": "ok"}, {"type": "input_image", "image_url": PNG, "foo": 1}]}],
     "input[2].output[1].foo", "unknown_parameter"),
    ([{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Hm.", "foo": 1}]}, *HI],
     "input[0].summary[0].foo", "unknown_parameter"),
    ([{"role": "user", "content": [{"type": "input_text", "text": "See"},
                                   {"type": "input_image", "image_url": PNG, "file_id": "file_1"}]}],
     "input[0].content[1].file_id", "unsupported_parameter"),
    ([{"role": "user", "content": [{"type": "input_file", "filename": "a.pdf", "file_data": "JVBERi0="}]}],
     "input[0].content[0].file_data", "unsupported_parameter"),
    ([{"type": "item_reference", "id": "msg_1", "foo": 1}, *HI], "input[0].foo", "unknown_parameter"),
])
def test_responses_input_items_and_parts_are_checked(oai, tiny_model, input_, param, code):
    _openai_400(lambda: oai.responses.create(model=tiny_model, input=input_, max_output_tokens=2), param, code)


def _feed_back(oai, tiny_model, items: list) -> None:
    """`items` after the question, then the tool's answer: a 200 with nothing named ignored."""
    answered = {"type": "function_call_output", "call_id": "call_x", "output": "Sunny"}
    calls = [item for item in items if (item["type"] if isinstance(item, dict) else item.type) == "function_call"]
    if calls:
        first = calls[0]
        answered["call_id"] = first["call_id"] if isinstance(first, dict) else first.call_id
    raw = oai.responses.with_raw_response.create(
        model=tiny_model, max_output_tokens=2, input=[{"role": "user", "content": "Weather?"}, *items, answered])
    assert raw.status_code == 200 and raw.parse().status in ("completed", "incomplete")
    assert HEADER not in raw.headers, raw.headers[HEADER]


def test_a_responses_output_sent_back_as_it_came_passes(oai, tiny_model):
    """The output of a Hearth response fed back as input, however a client keeps it: the SDK's objects (as
    the openai docs do: `input += response.output`), their dumps with and without the nulls, the JSON as it
    came over the wire, and the items a stream's output_item.done events carried (as Codex keeps them)."""
    ask = dict(model=tiny_model, input="Weather?", max_output_tokens=300, tools=[{"type": "function", **FUNCTION}],
               reasoning={"effort": "high"}, include=["reasoning.encrypted_content"], store=False,
               extra_body={"guided_grammar": "root ::= " + json.dumps(
                   'Plan.</think>\n\nLet me look.<tool_call>{"name": "f", "arguments": {}}</tool_call>')})
    raw = oai.responses.with_raw_response.create(**ask)
    response = raw.parse()
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    wire = raw.http_response.json()["output"]
    assert wire[0]["encrypted_content"] and wire[1]["content"][0]["annotations"] == []
    with oai.responses.stream(**ask) as stream:
        streamed = [event.item for event in stream if event.type == "response.output_item.done"]
    for items in (response.output, [i.model_dump(by_alias=True) for i in response.output],  # `async`, not `async_`
                  [i.model_dump(by_alias=True, exclude_none=True) for i in response.output], wire,
                  [i.model_dump(by_alias=True, exclude_unset=True) for i in streamed]):
        _feed_back(oai, tiny_model, items)


def test_codex_like_turns_pass(oai, tiny_model):
    """A Codex turn: developer and user messages of input_text parts, the earlier reasoning with its
    encrypted_content, an assistant message of output_text, a call and its output as a list of parts, and
    the fields OpenAI's own output items carry (logprobs, an assistant's phase) sent back too."""
    codex = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look."}],
         "content": [{"type": "reasoning_text", "text": "Look it up."}], "encrypted_content": "TG9vay4="},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [
            {"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}",
         "status": "completed", "caller": {"type": "direct"}},
        {"type": "function_call_output", "call_id": "c1", "status": "completed", "output": [
            {"type": "input_text", "text": "Sunny", "prompt_cache_breakpoint": {}}]},
    ]
    raw = oai.responses.with_raw_response.create(model=tiny_model, input=codex, max_output_tokens=2)
    assert raw.parse().status in ("completed", "incomplete") and HEADER not in raw.headers
    codex[3]["phase"] = "commentary"  # gpt-5.x-codex's label, read by nothing here
    raw = oai.responses.with_raw_response.create(model=tiny_model, input=codex, max_output_tokens=2)
    assert raw.headers[HEADER] == "input[3].phase"


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
        _hints(ChatCompletionAssistantMessageParam) | {"reasoning_content", "reasoning", "annotations", "parsed"}
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


def test_the_responses_input_tables_name_the_sdks_keys():
    """Each input item's keys are the union of the SDK types a client may send it as (an input message, an
    easy one, an output item sent back), and each part's its SDK type's."""
    from openai.types import responses as types
    from openai.types.responses import response_input_item_param as item
    from openai.types.responses.response_reasoning_item_param import Content, Summary

    def keys(node) -> set[str]:
        return set(node.keys)

    items = inner_fields.RESPONSES.inner["input"].item.kinds
    message, parts = items["message"].kinds, inner_fields._PART.kinds
    for role in ("user", "system", "developer"):  # with an id: the items of GET /v1/responses/{id}/input_items
        assert keys(message[role]) == _hints(item.Message) | _hints(types.EasyInputMessageParam) | {"id"}
    assert keys(message["assistant"]) == \
        _hints(types.EasyInputMessageParam) | _hints(types.ResponseOutputMessageParam)
    assert keys(items["function_call"]) == _hints(types.ResponseFunctionToolCallParam)
    assert keys(items["function_call_output"]) == _hints(item.FunctionCallOutput)
    assert keys(items["reasoning"]) == _hints(types.ResponseReasoningItemParam)
    assert keys(items["reasoning"].inner["summary"].item.kinds["summary_text"]) == _hints(Summary)
    assert keys(items["reasoning"].inner["content"].item.kinds["reasoning_text"]) == _hints(Content)
    assert keys(items["item_reference"]) == _hints(item.ItemReference)
    assert items["function_call_output"].inner["output"].item.kinds is parts
    for kind, sdk in (("input_text", types.ResponseInputTextParam), ("input_image", types.ResponseInputImageParam),
                      ("input_file", types.ResponseInputFileParam), ("output_text", types.ResponseOutputTextParam),
                      ("refusal", types.ResponseOutputRefusalParam),
                      ("input_text", types.ResponseInputTextContentParam),
                      ("input_image", types.ResponseInputImageContentParam),
                      ("input_file", types.ResponseInputFileContentParam)):
        assert keys(parts[kind]) == _hints(sdk), kind
    assert keys(parts["input_audio"]) >= _hints(types.ResponseInputAudioParam)  # chat's has a cache breakpoint
