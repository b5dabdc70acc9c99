"""Properties of the parsers that take outside text, checked with Hypothesis:
whatever a client or a model sends, each answers a value or its one refusal
type, never another exception.

- strict JSON (`core.jsonbody`): any bytes give a value or `JsonRefused`; a
  value nested past the cap, and a string holding a lone surrogate, are
  refused; any other JSON document reads back as it was written;
- the model-output parser (`protocols.output`): any text fed in any chunks
  reads as it does fed whole;
- tool-call parsing and repair (`protocols.toolcalls`): any text gives calls
  with a name and a JSON object of arguments, or nothing;
- SSE framing (`core.sse`): any event reads back through an SSE parser;
- sampling fields (`protocols.params`): any JSON value gives a checked
  request or a `RequestError` naming a field;
- Anthropic and Responses bodies: any JSON object becomes a chat body or a
  `RequestError`, and that chat body reads the same way.
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core import jsonbody, sse
from core.limits import Limits
from inference.engine.types import GenerationRequest, SamplingParams
from inference.protocols import anthropic, chat, embeddings, openai, params, responses, structured, toolcalls
from inference.protocols.errors import RequestError
from inference.protocols.options import ServerDefaults
from inference.protocols.output import OutputParser
from inference.protocols.response_store import ResponseStore

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
VOCAB, WINDOW = 320, 2048  # the tiny model's
LIMITS = Limits()


# -- JSON values ---------------------------------------------------------------
# Keys and strings from the protocols' own vocabulary, so generated bodies get
# past the first check and into the code behind it.
WORDS = ["role", "content", "type", "text", "name", "input", "arguments", "function", "tool_calls", "tools",
         "messages", "system", "user", "assistant", "tool", "developer", "tool_use", "tool_result", "thinking",
         "image", "input_text", "output_text", "function_call", "function_call_output", "message", "reasoning",
         "auto", "any", "none", "required", "enabled", "disabled", "json_schema", "json_object", "schema",
         "format", "parameters", "input_schema", "call_id", "id", "output", "effort", "tool_use_id", "is_error",
         "regex", "choice", "grammar", "json", "properties", "float", "base64", "a+b", "stop", ""]
TEXT = st.one_of(st.sampled_from(WORDS), st.text(max_size=12))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-2**70, max_value=2**70),
                    st.just(10**400), st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(TEXT, inner, max_size=5)), max_leaves=20)


def objects(fields) -> st.SearchStrategy[dict]:
    """JSON objects whose keys are mostly `fields`."""
    return st.dictionaries(st.one_of(st.sampled_from(list(fields)), TEXT), JSON, max_size=len(fields) + 2)


# -- strict JSON ---------------------------------------------------------------
def nested(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = [value]
    return value


@FAST
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
@example(b'{"a": NaN}')
@example(b"[1e999]")
@example(b'"\\ud800"')
@example(b"[" * 100_000)
def test_jsonbody_answers_a_value_or_its_refusal(data):
    try:
        jsonbody.loads(data, max_depth=8)
    except jsonbody.JsonRefused:
        pass


@FAST
@given(JSON, st.integers(0, 12))
def test_jsonbody_reads_back_any_document_within_the_depth_cap(value, cap):
    text = json.dumps(value)
    if jsonbody.depth(value) > cap:
        with pytest.raises(jsonbody.JsonRefused, match="nested more than"):
            jsonbody.loads(text, max_depth=cap)
    else:
        assert jsonbody.loads(text, max_depth=cap) == value
        assert jsonbody.loads(text.encode(), max_depth=cap) == value


@FAST
@given(st.integers(1, 40), st.integers(1, 40))
def test_jsonbody_depth_cap_is_exact(levels, cap):
    text = json.dumps(nested(levels))
    if levels > cap:
        with pytest.raises(jsonbody.JsonRefused):
            jsonbody.loads(text, max_depth=cap)
    else:
        assert jsonbody.loads(text, max_depth=cap) == nested(levels)


@FAST
@given(st.text(max_size=6), st.integers(0xD800, 0xDFFF), st.text(max_size=6), st.booleans())
def test_jsonbody_refuses_a_lone_surrogate_anywhere(before, surrogate, after, as_key):
    text = json.dumps(before + chr(surrogate) + after)  # ensure_ascii spells it \udXXX
    document = "{%s: 1}" % text if as_key else "[1, {\"a\": %s}]" % text
    with pytest.raises(jsonbody.JsonRefused, match="surrogate"):
        jsonbody.loads(document)
    raw = document.replace(text, json.dumps(before + chr(surrogate) + after, ensure_ascii=False))
    for data in (document.encode(), raw, raw.encode("utf-8", "surrogatepass"),
                 raw.encode("utf-16-le", "surrogatepass")):  # escaped, or the character itself
        with pytest.raises(jsonbody.JsonRefused, match="surrogate"):
            jsonbody.loads(data)


def test_jsonbody_keeps_an_escaped_surrogate_pair():
    assert jsonbody.loads('"\\ud83d\\ude00"') == "\U0001F600"


# -- the model-output parser -------------------------------------------------------
# Model text: the markup the parser looks for, broken markup, JSON, and prose.
MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
          "</parameter>", ">", "<", "/", "{", "}", '"name"', '"arguments"', ":", ",", '"f"', "\n", " ", "x",
          "<th", "ink>", "</tool", "_call>", "'", "[", "]", "true", "None"]
MODEL_TEXT = st.lists(st.one_of(st.sampled_from(MARKUP), st.text(max_size=5)), max_size=25).map("".join)
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}}}]
PARSERS = st.builds(lambda in_reasoning, reasoning, tools, single: dict(
    in_reasoning=in_reasoning, reasoning=reasoning, tools=TOOLS if tools else None, max_calls=1 if single else None),
    st.booleans(), st.booleans(), st.booleans(), st.booleans())


def _read(options: dict, chunks: list[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(pieces, calls) a parser makes of `chunks`: pieces joined by kind, calls by name and arguments."""
    parser = OutputParser(**options)
    pieces = [p for chunk in chunks for p in parser.feed(chunk)] + parser.finish()
    joined: list[tuple[str, str]] = []
    for p in pieces:
        assert p.text, "an empty piece"
        if joined and joined[-1][0] == p.kind:
            joined[-1] = (p.kind, joined[-1][1] + p.text)
        else:
            joined.append((p.kind, p.text))
    for call in parser.calls:
        assert call.name and isinstance(json.loads(call.arguments), dict)
    return joined, [(c.name, c.arguments) for c in parser.calls]


@settings(max_examples=200, deadline=None, database=None)
@given(PARSERS, MODEL_TEXT, st.sets(st.integers(1, 400), max_size=8))
@example(dict(in_reasoning=False, reasoning=True, tools=None, max_calls=None), "<think>a</think>\n\nb", {3, 9, 17})
@example(dict(in_reasoning=False, reasoning=False, tools=TOOLS, max_calls=1),
         'x<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call><function=f><parameter=a>2', {4, 12, 60, 66})
def test_output_parser_reads_any_chunking_as_the_whole(options, text, cut_at):
    cuts = sorted({c % len(text) for c in cut_at} - {0}) if text else []
    chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    whole = _read(options, [text])
    assert _read(options, chunks) == whole
    if not options["tools"]:
        assert not whole[1]
        if not (options["reasoning"] or options["in_reasoning"]):  # nothing to look for: the text comes back
            assert whole[0] == ([("content", text)] if text else [])


# -- tool calls ------------------------------------------------------------------
@FAST
@given(MODEL_TEXT, st.one_of(st.none(), st.just(TOOLS), st.lists(JSON, max_size=3)))
@example('{"name": "f", "arguments": "{\\"a\\": 1"}', TOOLS)
@example("<function=f><parameter=a>\n3\n</parameter></function>", TOOLS)
def test_tool_call_parsing_answers_calls_or_nothing(body, tools):
    calls = toolcalls.parse_block(body, tools)
    assert calls is None or calls
    for call in calls or []:
        assert isinstance(call.name, str) and call.name
        assert isinstance(json.loads(call.arguments), dict)
        assert call.id.startswith("call_")


@FAST
@given(st.one_of(MODEL_TEXT, JSON.map(json.dumps), JSON.map(lambda v: json.dumps(v)[:-1])))
def test_json_repair_answers_an_object_or_none(text):
    value = toolcalls.repair_json(text)
    assert value is None or isinstance(value, dict)
    if value is not None:
        json.dumps(value)


@FAST
@given(JSON.filter(lambda v: isinstance(v, dict)))
def test_json_repair_reads_a_valid_object_as_it_is(value):
    assert toolcalls.repair_json(json.dumps(value)) == value


@FAST
@given(st.text(max_size=20), JSON)
def test_a_parameter_value_decodes_against_any_schema(raw, prop):
    toolcalls.decode_value(raw, prop)
    toolcalls.tool_schemas(prop if isinstance(prop, list) else [prop])


# -- SSE framing -----------------------------------------------------------------
def read_sse(stream: bytes) -> list[tuple[str, str]]:
    """(event type, data) of each event in `stream`, read as the WHATWG
    EventSource parser reads it."""
    events, data, kind = [], None, "message"
    for line in stream.decode().replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line == "":
            if data is not None:
                events.append((kind, "\n".join(data)))
            data, kind = None, "message"
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data = [*(data or []), value]
        elif field == "event":
            kind = value
    return events


# Event names are the server's own constants: text UTF-8 can carry (no lone surrogates), one line, no colon.
EVENT_NAMES = st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_characters="\r\n:", codec="utf-8"),
                                           min_size=1, max_size=10).filter(lambda s: not s.startswith(" ")))


@FAST
@given(st.one_of(JSON.filter(lambda v: not isinstance(v, str)), st.text()), EVENT_NAMES)
@example("[DONE]", None)
@example("two\nlines\r\nand\rmore", "x")
def test_an_sse_frame_reads_back_as_its_event(data, event):
    stream = sse.frame(data, event) + sse.KEEP_ALIVE + sse.frame({"after": True})
    events = read_sse(stream)
    assert len(events) == 2
    kind, text = events[0]
    assert kind == (event or "message")
    if isinstance(data, str):
        assert text == data.replace("\r\n", "\n").replace("\r", "\n")
    else:
        assert json.loads(text) == data
    assert events[1] == ("message", '{"after": true}')


# -- sampling fields ---------------------------------------------------------------
FIELDS = (*params.SAMPLING, "logit_bias", "max_tokens", "max_completion_tokens", "stop", "logprobs", "top_logprobs",
          "n", "stream", "session_id", "prompt_cache_key", "adapter")
DEFAULTS = st.builds(ServerDefaults, max_tokens=st.none() | st.integers(0, 64),
                     temperature=st.none() | st.floats(0, 2), top_p=st.none() | st.floats(0, 1),
                     top_k=st.none() | st.integers(0, 1000))


@pytest.fixture(scope="module")
def tiny(tiny_model):
    """The tiny model, loaded in this process, for the protocol code that reads a model."""
    from inference.engine import loader

    return loader.load(tiny_model)


def read_request(model, body: dict, defaults: ServerDefaults, generation_config: dict) -> GenerationRequest:
    """What the chat and completion routes read from a body's shared fields (`openai._common`),
    for a model whose generation_config is `generation_config`."""
    model.generation_config = generation_config
    params.session_key(body, {})
    return openai._common(body, model, defaults)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


@settings(max_examples=150, deadline=None, database=None)
@given(objects(FIELDS), DEFAULTS, objects(("temperature", "top_p", "top_k", "do_sample")))
@example({"temperature": 10**400}, ServerDefaults(), {})
@example({"top_p": -(10**400)}, ServerDefaults(), {})
@example({}, ServerDefaults(), {"temperature": 10**400, "top_k": 10**400})
def test_sampling_fields_give_a_checked_request_or_a_request_error(tiny, body, defaults, generation_config):
    try:
        request = read_request(tiny, body, defaults, generation_config)
    except RequestError as exc:
        assert exc.status == 400 and str(exc)
        return
    s = request.sampling
    assert isinstance(s, SamplingParams)
    assert all(_finite(v) for v in (s.temperature, s.top_p, s.min_p, s.xtc_probability, s.xtc_threshold))
    assert 0 <= s.top_k < VOCAB and (s.seed is None or 0 <= s.seed < 2**64)
    assert request.max_tokens is None or request.max_tokens >= 1


@FAST
@given(JSON)
@example(10**400)
@example(-(10**400))
def test_a_number_field_reads_any_value(value):
    try:
        got = params.number({"x": value}, "x", 0.0, 2.0)
    except RequestError as exc:
        assert exc.param == "x"
    else:
        assert got is None or 0.0 <= got <= 2.0


# -- protocol bodies -----------------------------------------------------------------
MESSAGE_FIELDS = ("messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice", "thinking",
                  "temperature", "stream", "logit_bias", "chat_template_kwargs", "response_format")
RESPONSES_FIELDS = ("input", "instructions", "previous_response_id", "max_output_tokens", "tools", "tool_choice",
                    "text", "reasoning", "store", "stream", "temperature", "stop")
CHAT_FIELDS = ("messages", "tools", "tool_choice", "chat_template_kwargs", "reasoning_effort", "guided_grammar",
               "response_format", "structured_outputs", "guided_regex", "guided_choice", "input",
               "encoding_format", "dimensions", "instruction")


BODIES = settings(max_examples=80, deadline=None, database=None)


def _messages_like() -> st.SearchStrategy:
    block = objects(("type", "text", "name", "input", "id", "tool_use_id", "content", "is_error"))
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "x"])},
                                    optional={"content": st.one_of(TEXT, st.lists(block, max_size=3)),
                                              "tool_calls": JSON, "type": TEXT, "name": TEXT, "call_id": TEXT})
    return st.lists(message, max_size=4)


def read_chat_body(body: dict) -> None:
    """The chat-side reading every protocol's body goes through before a prompt exists."""
    messages = chat.normalize_messages(body.get("messages"), LIMITS)
    kwargs, template = chat.template_kwargs(body, LIMITS)
    tools = chat.tools_for(body)
    chat.check_size(messages, tools, kwargs, template, LIMITS)
    structured.requested(body, LIMITS)


@BODIES
@given(objects(MESSAGE_FIELDS), _messages_like())
def test_an_anthropic_body_becomes_a_chat_body_or_a_request_error(body, messages):
    for candidate in (body, {**body, "messages": messages}):
        for read in (anthropic.to_chat_body, anthropic.count_body):  # count_body takes no max_tokens
            try:
                read_chat_body(read(candidate))
            except RequestError as exc:
                assert exc.status == 400 and str(exc)


@BODIES
@given(objects(RESPONSES_FIELDS), _messages_like())
def test_a_responses_body_becomes_a_chat_body_or_a_request_error(body, items):
    store = ResponseStore()
    for candidate in (body, {**body, "input": items}):
        try:
            turn = responses.Turn(candidate, store)
            read_chat_body(turn.chat_body(candidate))
        except RequestError as exc:
            assert exc.status in (400, 404) and str(exc)


@BODIES
@given(objects(CHAT_FIELDS), _messages_like())
def test_a_chat_or_embeddings_body_reads_or_is_refused(body, messages):
    for candidate in (body, {**body, "messages": messages}):
        for read in (read_chat_body, lambda b: embeddings.inputs(b, LIMITS, 320), embeddings.encoding):
            try:
                read(candidate)
            except RequestError as exc:
                assert exc.status == 400 and str(exc)
