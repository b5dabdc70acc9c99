"""Tool-call arguments streamed as they are read (inference/protocols/argstream.py):
what a client concatenates is what the server records, and it is JSON,
whatever the model writes."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from inference.protocols.argstream import ArgumentStreamer
from inference.protocols.output import OutputParser, ToolDelta

TOOLS = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "body": {"type": "string"}, "mode": {"type": "integer"}}}}}]
PROPS = TOOLS[0]["function"]["parameters"]["properties"]


def stream(text: str, props: dict | None = None, repaired: str | None = None, step: int = 1):
    """Feed `text` `step` characters at a time; the pieces sent and the record."""
    reader, pieces = ArgumentStreamer(props or {}), []
    for end in range(step, len(text) + step, step):
        pieces.append(reader.feed(text[:end]))
    rest, record = reader.close(lambda: repaired)
    return [p for p in pieces + [rest] if p], record, reader


def test_well_formed_arguments_stream_as_json_dumps_writes_them():
    text = '{ "path":"a.txt" ,"body" : "line one\\nline \\"two\\"", "mode":420 }'
    pieces, record, _ = stream(text, PROPS)
    assert "".join(pieces) == record == json.dumps(json.loads(text), ensure_ascii=False)
    assert len(pieces) > 20  # the strings went out as they came


def test_a_raw_newline_in_a_string_goes_out_escaped():
    pieces, record, _ = stream('{"body": "a\nb"}', PROPS)
    assert "".join(pieces) == record and json.loads(record) == {"body": "a\nb"}


def test_a_non_string_for_a_string_property_is_coerced_as_the_whole_call_path_does():
    _, record, _ = stream('{"path": 3, "body": {"k": [1, true]}, "mode": 7}', PROPS)
    assert json.loads(record) == {"path": "3", "body": '{"k": [1, true]}', "mode": 7}


def test_unreadable_text_stops_the_stream_and_the_repair_completes_it():
    text = "{\"path\": \"x\", \"mode\": True}"
    repaired = json.dumps({"path": "x", "mode": True})
    pieces, record, reader = stream(text, PROPS, repaired=repaired)
    assert reader.broken and "".join(pieces) == record == repaired


def test_when_the_repair_disagrees_what_was_sent_is_closed():
    pieces, record, _ = stream('{"path": "abc', PROPS, repaired='{"other": 1}')
    assert "".join(pieces) == record == '{"path": "abc"}'
    _, record, _ = stream("{'path': 1}", PROPS, repaired=None)
    assert record == "{}"


def test_truncated_arguments_close_with_the_members_that_came():
    for text, expected in [('{"path": "Par', {"path": "Par"}), ('{"mode": 12', {"mode": 12}),
                           ('{"path": "a", "bo', {"path": "a"}), ('{"path": "a\\u00', {"path": "a"}),
                           ("{", {}), ('{"path": "x\\', {"path": "x"})]:
        pieces, record, _ = stream(text, PROPS)
        assert "".join(pieces) == record and json.loads(record) == expected, text


def test_escapes_cut_between_pieces_wait_for_their_rest():
    text = '{"body": "smile \\ud83d\\ude00 tab\\t quote\\" slash\\/ e\\u00e9"}'
    for step in (1, 2, 3, 5):
        pieces, record, _ = stream(text, PROPS, step=step)
        assert "".join(pieces) == record == json.dumps(json.loads(text), ensure_ascii=False)
        assert all(p.encode("utf-8") for p in pieces)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=6), JSON, max_size=4), st.sampled_from([(",", ":"), (", ", ": "),
                                                                               (" ,\n ", " :\t")]),
       st.booleans(), st.integers(1, 7))
def test_any_object_however_written_and_cut_streams_to_its_own_json(obj, separators, ascii_only, step):
    text = json.dumps(obj, separators=separators, ensure_ascii=ascii_only)
    pieces, record, reader = stream(text, step=step)
    assert not reader.broken and "".join(pieces) == record
    assert json.loads(record) == obj and record == json.dumps(obj, ensure_ascii=False)


def test_unconstrained_calls_stream_through_the_output_parser():
    text = ('<tool_call>{"name": "write", "arguments": {"path": "notes.md", "body": "# Title\nSome text", '
            '"mode": "420"}}</tool_call>')
    parser = OutputParser(tools=TOOLS)
    for ch in text:
        parser.feed(ch)
    parser.finish()
    deltas = parser.take_deltas()
    assert deltas[0].name == "write" and deltas[-1].done and len(deltas) > 10
    assert "".join(d.arguments for d in deltas) == parser.calls[0].arguments
    assert json.loads(parser.calls[0].arguments) == {"path": "notes.md", "body": "# Title\nSome text", "mode": "420"}


def test_a_streamed_call_whose_quoting_went_wrong_ends_at_its_first_end_tag():
    """An offered tool's call streams its arguments as they come; when a string
    is left open and the end tag comes only inside it, the arguments go out only
    up to that tag, the tag ends the call, and what follows is the reply's text
    (as for a call that never streamed)."""
    text = '<tool_call>{"name":"write","arguments":{"path":"a}}</tool_call>\nDone, see above.'
    for step in (1, 7, len(text)):
        parser = OutputParser(tools=TOOLS)
        out = [p for end in range(0, len(text), step) for p in parser.feed(text[end:end + step])]
        out += parser.finish()
        deltas = parser.take_deltas()
        assert "".join(p.text for p in out) == "\nDone, see above.", step
        assert len(parser.calls) == 1 and json.loads(parser.calls[0].arguments) == {"path": "a}}"}, step
        assert "".join(d.arguments for d in deltas) == parser.calls[0].arguments, step
        assert "</tool_call>" not in "".join(d.arguments for d in deltas), step


def test_a_call_to_a_tool_nobody_offered_does_not_stream():
    parser = OutputParser(tools=TOOLS)
    text = '<tool_call>{"name": "rm", "arguments": {"path": "/"}}</tool_call>'
    out = [piece for ch in text for piece in parser.feed(ch)] + parser.finish()
    assert parser.take_deltas() == [] and parser.calls == []
    assert "".join(p.text for p in out) == text  # shown as the model wrote it, never as a call


XML_TOOLS = [{"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "text": {"type": "string"}, "line": {"type": "integer"}, "opts": {}}}}},
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]


def _run(text: str, step: int = 1, tools=XML_TOOLS):
    parser = OutputParser(tools=tools)
    out = [p for end in range(0, len(text), step) for p in parser.feed(text[end:end + step])] + parser.finish()
    return parser, parser.take_deltas(), "".join(p.text for p in out)


XML_CALL = ("<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a.py\n</parameter>\n<parameter=line>\n12\n"
            "</parameter>\n<parameter=text>\ndef f():\n    return \"<x>\"\n\n</parameter>\n<parameter=opts>\n"
            '{"dry": true}\n</parameter>\n</function>\n</tool_call>')


def test_qwen_xml_calls_stream_their_parameters_and_match_the_whole_reading():
    whole, _, _ = _run(XML_CALL, step=len(XML_CALL))
    expected = {"path": "src/a.py", "line": 12, "text": 'def f():\n    return "<x>"\n', "opts": {"dry": True}}
    assert json.loads(whole.calls[0].arguments) == expected
    for step in (1, 2, 7):
        parser, deltas, text = _run(XML_CALL, step)
        assert text == "" and deltas[0].name == "edit" and deltas[-1].done
        assert "".join(d.arguments for d in deltas) == parser.calls[0].arguments == whole.calls[0].arguments
    assert len(_run(XML_CALL)[1]) > 20  # the strings went out as they came


def test_qwen_xml_on_its_own_truncated_and_several_in_one_block():
    parser, deltas, _ = _run("<function=edit>\n<parameter=path>\nnotes.md\n</parameter>\n<parameter=text>\nhal")
    assert "".join(d.arguments for d in deltas) == parser.calls[0].arguments
    assert json.loads(parser.calls[0].arguments) == {"path": "notes.md", "text": "hal"}
    two = ("<tool_call>\n<function=ls>\n</function>\n<function=edit>\n<parameter=line>\n3\n</parameter>\n"
           "</function>\n</tool_call>")
    parser, deltas, _ = _run(two)
    assert [c.name for c in parser.calls] == ["ls", "edit"] and json.loads(parser.calls[1].arguments) == {"line": 3}
    assert parser.calls[0].arguments == "{}" and deltas[-1].done and deltas[-1].name == "edit"


def test_text_after_a_call_keeps_its_place_when_it_comes_in_one_delta():
    """Several tokens arrive as one event when a stream's reader falls behind the
    engine (rows.Submission.events joins them): the text after a call must still
    follow the call (a Responses message item, an Anthropic text block of its own)."""
    text = 'A. <tool_call>{"name": "write", "arguments": {"path": "x"}}</tool_call> B.'

    def shape(items) -> list[str]:
        """Runs of text joined, runs of call deltas as one "call"."""
        out: list[str] = []
        for item in items:
            if isinstance(item, ToolDelta):
                out += [] if out and out[-1] == "call" else ["call"]
            elif item.text:
                out[-1:] = [out[-1] + item.text] if out and out[-1] != "call" else [*out[-1:], item.text]
        return out

    whole = OutputParser(tools=TOOLS)
    at_once = whole.ordered(text, finish=True)
    assert shape(at_once) == ["A. ", "call", " B."]
    by_char = OutputParser(tools=TOOLS)
    items = [i for ch in text for i in by_char.ordered(ch)] + by_char.ordered("", finish=True)
    assert shape(items) == ["A. ", "call", " B."]
    assert whole.calls[0].arguments == by_char.calls[0].arguments == '{"path": "x"}'


def test_a_cut_call_sends_no_more_once_the_reader_stopped_at_text_it_could_not_accept():
    """What went out stays a JSON prefix (the Anthropic SDK parses every `input_json_delta` as partial JSON):
    a `True` the reader refused is not sent on at the cut."""
    reader = ArgumentStreamer({})
    reader.feed('{"a": 1, "b": True, "c": "x')
    rest, arguments = reader.cut()
    assert "True" not in arguments and arguments.startswith('{"a": 1') and reader.broken
