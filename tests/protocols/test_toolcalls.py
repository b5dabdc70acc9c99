"""The tool-call parser, its repair pass, and the streaming splitter."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.protocols.output import OutputParser
from inference.protocols.toolcalls import parse_block, repair_json

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "tags": {"type": "array"}, "zip": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}}}}},
]

# (markup body, expected (name, arguments) or None when it must stay content)
TABLE = [
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', ("get_weather", {"city": "Paris"})),
    ('```json\n{"name": "search", "arguments": {"query": "cats"}}\n```', ("search", {"query": "cats"})),
    ('Sure, calling it: {"name": "search", "arguments": {"query": "x"}}', ("search", {"query": "x"})),
    ("{'name': 'search', 'arguments': {'query': 'it\\'s'}}", ("search", {"query": "it's"})),
    ('{"name": "get_weather", "arguments": {"city": "Oslo",},}', ("get_weather", {"city": "Oslo"})),
    ('{"name": "get_weather", "arguments": {"city": "Oslo"', ("get_weather", {"city": "Oslo"})),
    ('{"name": "get_weather", "arguments": {"city": "Os', ("get_weather", {"city": "Os"})),
    ('{"arguments": {"name": "search", "query": "dogs"}}', ("search", {"query": "dogs"})),
    ('{"name": "get_weather", "arguments": {"metric": True, "tags": None, "city": "True story"}}',
     ("get_weather", {"metric": True, "tags": None, "city": "True story"})),
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}', ("get_weather", {"city": "Rome"})),
    ('{"type": "function", "function": {"name": "search", "arguments": {"query": "q"}}}', ("search", {"query": "q"})),
    ('{"name": "get_weather", "parameters": {"city": "Lima"}}', ("get_weather", {"city": "Lima"})),
    ('{"name": "get_weather", "arguments": {"zip": 75001}}', ("get_weather", {"zip": "75001"})),
    ('{"name": "get_weather", "arguments": {}} and then some prose', ("get_weather", {})),
    ("<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "<parameter=metric>\ntrue\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n</function>",
     ("get_weather", {"city": "New York", "days": 3, "metric": True, "tags": ["a", "b"]})),
    ("<function=search>\n<parameter=query>\n  indented &amp; \\\"escaped\\\"\n\n</parameter>\n</function>",
     ("search", {"query": "  indented &amp; \\\"escaped\\\"\n"})),
    ("<function=get_weather>\n<parameter=zip>\n01234\n</parameter>\n</function>", ("get_weather", {"zip": "01234"})),
    ("not a tool call at all", None),
    ('{"arguments": {"query": "no name"}}', None),
    ("", None),
    ("{{{{", None),
]


@pytest.mark.parametrize("body,expected", TABLE)
def test_parse_table(body, expected):
    calls = parse_block(body, TOOLS)
    if expected is None:
        assert calls is None
    else:
        assert calls is not None and len(calls) == 1
        assert (calls[0].name, json.loads(calls[0].arguments)) == expected
        assert calls[0].id.startswith("call_")


def test_repair_keeps_python_words_inside_strings():
    assert repair_json('{"a": "None of True", "b": False}') == {"a": "None of True", "b": False}


def _run(parser: OutputParser, chunks):
    pieces = []
    for chunk in chunks:
        pieces += parser.feed(chunk)
    pieces += parser.finish()
    content = "".join(p.text for p in pieces if p.kind == "content")
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    return content, reasoning, [(c.name, json.loads(c.arguments)) for c in parser.calls]


def test_content_streams_before_the_markup_and_the_call_is_withheld():
    parser = OutputParser(tools=TOOLS)
    first = parser.feed("Let me check. <tool_")
    assert "".join(p.text for p in first) == "Let me check. "
    assert parser.feed('call>{"name": "search", "arguments": {"query": "x"}') == []
    assert parser.buffering
    assert parser.feed("}</tool_call>") == [] and not parser.buffering
    assert [(c.name, c.arguments) for c in parser.calls] == [("search", '{"query": "x"}')]


def test_reasoning_channel():
    parser = OutputParser(in_reasoning=True, reasoning=True)
    assert _run(parser, ["I should ", "greet.</th", "ink>\n\nHello!"]) == ("Hello!", "I should greet.", [])
    parser = OutputParser(reasoning=True)
    assert _run(parser, ["<think>hm</think>", "Hi"]) == ("Hi", "hm", [])
    assert _run(OutputParser(), ["<think>x</think>"]) == ("<think>x</think>", "", [])


def test_unparseable_markup_falls_back_to_content():
    text = "<tool_call>not json at all</tool_call> after"
    assert _run(OutputParser(tools=TOOLS), [text]) == (text, "", [])


def test_tools_off_leaves_markup_alone():
    text = '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    assert _run(OutputParser(), [text]) == (text, "", [])


def test_truncated_call_at_the_end_is_repaired():
    text = '<tool_call>{"name": "search", "arguments": {"query": "cut'
    assert _run(OutputParser(tools=TOOLS), [text]) == ("", "", [("search", {"query": "cut"})])


def test_a_call_the_generation_was_cut_off_in_is_recorded_as_cut_and_as_written():
    """`finish(cut=True)`: the token limit or a stop sequence ended the text inside the call."""
    for text, arguments in (('{"query": "cut', '{"query": "cut'), ('{"query": "a", "n": 1', '{"query": "a", "n": 1'),
                            ('{"query"', '{"query"'), ("{", "{")):
        parser = OutputParser(tools=TOOLS)
        pieces = parser.feed('<tool_call>{"name": "search", "arguments": ' + text) + parser.finish(cut=True)
        assert pieces == [] and [(c.name, c.arguments, c.cut) for c in parser.calls] == [("search", arguments, True)]
    parser = OutputParser(tools=TOOLS)  # its arguments were whole: only the markup's end was cut
    parser.feed('<tool_call>{"name": "search", "arguments": {"query": "a"}')
    parser.finish(cut=True)
    assert [(c.arguments, c.cut) for c in parser.calls] == [('{"query": "a"}', False)]
    parser = OutputParser(tools=TOOLS)  # no name yet: neither a call nor content
    assert parser.feed('<tool_call>{"na') + parser.finish(cut=True) == [] and parser.calls == []


def test_finished_members_leave_out_the_one_cut():
    from inference.protocols.argstream import finished_members

    assert finished_members('{"days": 2, "city": "Ro') == {"days": 2}
    assert finished_members('{"days": 2, "n": 12') == {"days": 2}
    assert finished_members('{"a": {"b": 1}, "c": [1, 2') == {"a": {"b": 1}}
    assert finished_members('{"city"') == finished_members("{") == finished_members("") == {}


def test_two_calls_and_qwen_form():
    text = ('<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>'
            "<tool_call><function=search><parameter=query>b</parameter></function></tool_call>"
            "<function=search><parameter=query>c</parameter></function>")
    content, _, calls = _run(OutputParser(tools=TOOLS), [text[i:i + 7] for i in range(0, len(text), 7)])
    assert content == "" and calls == [("search", {"query": q}) for q in "abc"]


markup = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", "<function=search>",
                          "</function>", "<parameter=query>", "</parameter>", "{", "}", '"', "'", ",",
                          "True", "name", ":", "\n", "<", "/", ">", "```"])
texts = st.lists(st.one_of(markup, st.text(max_size=5)), max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(1, 9), st.booleans(), st.booleans())
def test_parser_never_raises_and_chunking_never_matters(text, size, tools, reasoning):
    def run(chunks):
        return _run(OutputParser(tools=TOOLS if tools else None, reasoning=reasoning), chunks)

    whole = run([text])
    assert run([text[i:i + size] for i in range(0, len(text), size)]) == whole


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(1, 9))
def test_no_visible_text_is_lost(text, size):
    chunks = [text[i:i + size] for i in range(0, len(text), size)]
    content, reasoning, calls = _run(OutputParser(tools=TOOLS), chunks)
    if not calls:  # nothing became a tool call: every character is still there
        assert content == text and reasoning == ""
    content, _, _ = _run(OutputParser(), chunks)
    assert content == text
