"""No field is accepted and ignored: the fields of OpenAI's and Anthropic's
bodies Hearth does not build are refused with a 400 naming them when they ask
for something, pass when they ask for nothing, and a field nothing reads is
named in the X-Hearth-Ignored-Fields header (through the official SDKs)."""
from __future__ import annotations

import base64
import json

import anthropic
import openai
import pytest

from inference.protocols import unhonoured

HI = [{"role": "user", "content": "Hi"}]
HEADER = "x-hearth-ignored-fields"


def forced(text: str) -> dict:
    return {"guided_grammar": "root ::= " + json.dumps(text)}


def _refused(call, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    error = caught.value.body
    assert (error["param"], error["code"]) == (param, "unsupported_parameter"), error
    assert error["message"].startswith(f"{param} is not supported: ")


@pytest.mark.parametrize("extra", [
    {"web_search_options": {}}, {"prediction": {"type": "content", "content": "Hello"}}, {"store": True},
    {"audio": {"voice": "alloy", "format": "wav"}}, {"modalities": ["text", "audio"]},
    {"service_tier": "priority"}, {"functions": [{"name": "f", "parameters": {}}]}, {"function_call": "auto"}])
def test_chat_refuses_what_it_cannot_do(oai, tiny_model, extra):
    (name, value), = extra.items()
    _refused(lambda: oai.chat.completions.create(model=tiny_model, messages=HI, max_tokens=2,
                                                 extra_body={name: value}), name)


def test_chat_values_that_ask_nothing_pass_and_the_unread_are_named(oai, tiny_model):
    quiet = dict(store=False, service_tier="auto", modalities=["text"], verbosity="medium", user="u",
                 metadata={"run": "1"}, prompt_cache_retention="24h", seed=1)
    raw = oai.chat.completions.with_raw_response.create(model=tiny_model, messages=HI, max_tokens=2, **quiet)
    assert raw.parse().choices[0].message is not None and HEADER not in raw.headers
    raw = oai.chat.completions.with_raw_response.create(
        model=tiny_model, messages=HI, max_tokens=2, extra_body={"ignore_eos": True, "min_tokens": 3})
    assert raw.headers[HEADER] == "ignore_eos, min_tokens"
    # A name a header cannot carry (a line break) is counted, not repeated, and never a 500.
    raw = oai.chat.completions.with_raw_response.create(
        model=tiny_model, messages=HI, max_tokens=2, extra_body={"bad\nname": 1, "top_n": 2})
    assert raw.headers[HEADER] == "top_n, +1 more"


def test_stream_options_need_a_stream_and_ask_only_for_what_is_built(oai, tiny_model):
    """As on OpenAI: stream_options without stream: true is a 400 naming it,
    on chat and text completions; inside it, obfuscation padding (not sent
    here) and a key that is no option are refused, naming the key."""
    def chat(**extra):
        return oai.chat.completions.create(model=tiny_model, messages=HI, max_tokens=2, **extra)

    def completion(**extra):
        return oai.completions.create(model=tiny_model, prompt="Hi", max_tokens=2, **extra)

    for create in (chat, completion):
        for stream in ({}, {"stream": False}):
            with pytest.raises(openai.BadRequestError) as caught:
                create(stream_options={"include_usage": True}, **stream)
            assert caught.value.body["param"] == "stream_options"
            assert caught.value.body["message"] == \
                "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        _refused(lambda create=create: list(create(stream=True, stream_options={"include_obfuscation": True})),
                 "stream_options.include_obfuscation")
        with pytest.raises(openai.BadRequestError) as caught:
            list(create(stream=True, extra_body={"stream_options": {"include_usage": True, "continuous": True}}))
        assert caught.value.body["param"] == "stream_options.continuous"
        chunks = list(create(stream=True, stream_options={"include_usage": True, "include_obfuscation": False}))
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_verbosity_is_a_line_in_the_system_turn(oai, tiny_model):
    def prompt(**extra) -> int:
        return oai.chat.completions.create(model=tiny_model, messages=HI, max_tokens=1, **extra).usage.prompt_tokens

    plain = prompt()
    assert prompt(verbosity="medium") == plain < prompt(verbosity="low") and prompt(verbosity="high") > plain
    with pytest.raises(openai.BadRequestError) as caught:
        prompt(verbosity="loud")
    assert caught.value.body["param"] == "verbosity"
    with_text = oai.responses.create(model=tiny_model, input="Hi", max_output_tokens=1, text={"verbosity": "low"})
    without = oai.responses.create(model=tiny_model, input="Hi", max_output_tokens=1)
    assert with_text.usage.input_tokens > without.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model=tiny_model, input="Hi", max_output_tokens=1, text={"verbosity": "loud"})
    assert caught.value.body["param"] == "text.verbosity"


def test_completions_refusals(oai, tiny_model):
    for name, value in (("echo", True), ("best_of", 2), ("suffix", " end")):
        _refused(lambda extra={name: value}: oai.completions.create(model=tiny_model, prompt="Hi", max_tokens=2,
                                                                    extra_body=extra), name)
    raw = oai.completions.with_raw_response.create(model=tiny_model, prompt="Hi", max_tokens=2, echo=False,
                                                   best_of=1, n=2)
    assert len(raw.parse().choices) == 2 and HEADER not in raw.headers


@pytest.mark.parametrize("name,value", [
    ("background", True), ("conversation", "conv_1"), ("truncation", "auto"), ("top_logprobs", 2),
    ("include", ["message.output_text.logprobs"]), ("prompt", {"id": "pmpt_1"}), ("service_tier", "flex"),
    ("response_format", {"type": "json_object"}), ("context_management", [{"type": "compaction"}]),
    ("stream_options", {"include_obfuscation": True})])
def test_responses_refuses_what_it_cannot_do(oai, tiny_model, name, value):
    stream = {"stream": True} if name == "stream_options" else {}  # it needs a stream to be read at all
    _refused(lambda: oai.responses.create(model=tiny_model, input="Hi", max_output_tokens=2,
                                          extra_body={name: value, **stream}), name)


def test_responses_encrypted_reasoning_and_built_in_tools(oai, tiny_model):
    raw = oai.responses.with_raw_response.create(
        model=tiny_model, input="Hi", max_output_tokens=40, store=False, include=["reasoning.encrypted_content"],
        reasoning={"effort": "low"}, text={"verbosity": "medium"}, truncation="disabled", max_tool_calls=3,
        extra_body=forced("Plan.</think>\n\nHello"))
    assert HEADER not in raw.headers
    reasoning = raw.parse().output[0]
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "Plan."
    assert base64.b64decode(reasoning.encrypted_content).decode() == "Plan."
    # Sent back as Codex does with store=false: accepted (earlier reasoning is not replayed).
    again = oai.responses.create(model=tiny_model, max_output_tokens=2, store=False, input=[
        {"type": "message", "role": "user", "content": "Hi"}, reasoning.model_dump(exclude_none=True),
        {"type": "message", "role": "user", "content": "Again"}])
    assert again.status in ("completed", "incomplete")
    plain = oai.responses.create(model=tiny_model, input="Hi", max_output_tokens=40, reasoning={"effort": "low"},
                                 extra_body=forced("Plan.</think>\n\nHello"))
    assert plain.output[0].encrypted_content is None
    # A built-in tool never runs here: left out, and named.
    raw = oai.responses.with_raw_response.create(model=tiny_model, input="Hi", max_output_tokens=2,
                                                 tools=[{"type": "web_search"}])
    assert raw.headers[HEADER] == "tools[0]:web_search"


@pytest.mark.parametrize("name,value", [
    ("container", "container_1"), ("inference_geo", "us"), ("speed", "fast"), ("service_tier", "priority"),
    ("mcp_servers", [{"type": "url", "url": "http://x", "name": "x"}]), ("workspace_id", "wrkspc_1")])
def test_messages_refuses_what_it_cannot_do(app, name, value):
    claude = app.anthropic()
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model="m", max_tokens=2, messages=HI, extra_body={name: value})
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(f"{name} is not supported: ")


def test_messages_quiet_values_pass_and_unread_fields_are_named(app):
    claude = app.anthropic()
    raw = claude.messages.with_raw_response.create(
        model="m", max_tokens=2, messages=HI, service_tier="auto", metadata={"user_id": "u"},
        extra_body={"speed": "standard", "cache_control": {"type": "ephemeral"}})
    assert raw.parse().content is not None and HEADER not in raw.headers
    raw = claude.messages.with_raw_response.create(model="m", max_tokens=2, messages=HI,
                                                   extra_body={"context_management": {"edits": []},
                                                               "chat_template_kwargs": {"enable_thinking": False}})
    assert raw.headers[HEADER] == "context_management"  # chat_template_kwargs is read
    # count_tokens reads what Messages reads, and names the rest the same way.
    raw = claude.messages.with_raw_response.count_tokens(
        model="m", messages=HI, thinking={"type": "disabled"}, tool_choice={"type": "auto"},
        extra_body={"context_management": {"edits": []}, "max_tokens": 5})
    assert raw.parse().input_tokens > 0 and raw.headers[HEADER] == "context_management"
    raw = claude.messages.with_raw_response.count_tokens(model="m", messages=HI, tools=[
        {"type": "web_search_20250305", "name": "web_search"}])
    assert raw.headers[HEADER] == "tools[0]:web_search_20250305"


def test_every_refused_field_is_one_the_sdks_send():
    """The tables name real fields (a typo would refuse nothing): each is in the
    installed SDK's request type, or one a server reads beside it."""
    import typing

    from anthropic.types import message_create_params
    from openai.types import completion_create_params as legacy
    from openai.types.chat import completion_create_params as chat
    from openai.types.responses import response_create_params

    def fields(request_type) -> set[str]:
        return set(typing.get_type_hints(request_type))

    assert set(unhonoured.CHAT) <= fields(chat.CompletionCreateParamsBase)
    assert set(unhonoured.COMPLETIONS) <= fields(legacy.CompletionCreateParamsBase)
    assert set(unhonoured.RESPONSES) - {"response_format", "structured_outputs"} <= \
        fields(response_create_params.ResponseCreateParamsBase)
    assert set(unhonoured.MESSAGES) - {"mcp_servers"} <= fields(message_create_params.MessageCreateParamsBase)
