"""Every tool-call family mlx-lm knows, read by the one output parser: a
table of each family's markup (as its own parser reads it), fed whole and in
small pieces as a stream would bring it; and for the families tool_choice
enforces, xgrammar's structural tag accepts that same markup."""
from __future__ import annotations

import json

import pytest

from inference.protocols.markup import HEARTH, family_markup, markups_for
from inference.protocols.output import OutputParser

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}]
ARGS = {"city": "Paris", "days": 2}
# family -> the call as the model writes it, start and end tags included
FAMILIES = {
    "json_tools": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
    "qwen3_coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n"
                    "2\n</parameter>\n</function>\n</tool_call>"),
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>',
    "glm47": ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
              "<arg_value>2</arg_value></tool_call>"),
    "minicpm5": '<function name="get_weather"><param name="city">Paris</param><param name="days">2</param></function>',
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
    "pythonic": '<|tool_call_start|>[get_weather(city="Paris", days=2)]<|tool_call_end|>',
    "kimi_k2": ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                '{"city": "Paris", "days": 2}<|tool_call_end|><|tool_calls_section_end|>'),
    "function_gemma": "<start_function_call>call:get_weather{city:<escape>Paris<escape>,days:2}<end_function_call>",
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
}
# Llama 3's template (no mlx-lm parser: Hearth knows it by the instruction it gives)
LLAMA3_TEMPLATE = ('Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
                   'value}. Do not use variables.')


class _Tokenizer:
    """What markups_for reads of mlx-lm's tokenizer: the parser its loader inferred."""

    def __init__(self, family: str):
        import importlib

        if family == "llama3_json":
            self.chat_template = LLAMA3_TEMPLATE
        else:
            self._tool_parser = importlib.import_module(f"mlx_lm.tool_parsers.{family}").parse_tool_call


def _read(family: str, text: str, piece: int) -> OutputParser:
    parser = OutputParser(tools=TOOLS, markups=markups_for(_Tokenizer(family)))
    out = []
    for i in range(0, len(text), piece):
        out += parser.feed(text[i:i + piece])
    out += parser.finish()
    parser.shown = "".join(p.text for p in out)  # type: ignore[attr-defined]
    return parser


@pytest.mark.parametrize("piece", [10_000, 1, 3])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_is_read_whole_and_streamed(family, piece):
    text = "Let me check. " + FAMILIES[family]
    parser = _read(family, text, piece)
    assert [(c.name, json.loads(c.arguments)) for c in parser.calls] == [("get_weather", ARGS)], family
    assert parser.shown.strip() == "Let me check."  # the markup never shows as text


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_unreadable_markup_stays_visible(family):
    markup = markups_for(_Tokenizer(family))[0]
    broken = markup.start + "%%% not a call %%%" + markup.end
    parser = _read(family, broken, 4)
    assert parser.calls == [] and "not a call" in parser.shown


def test_hearths_own_families_keep_its_parser_and_others_come_first():
    assert markups_for(_Tokenizer("json_tools")) == HEARTH
    glm = markups_for(_Tokenizer("glm47"))
    assert glm[0].family == "glm47" and [m.start for m in glm[1:]] == ["<function="]  # its <tool_call> wins
    assert family_markup("mistral").end == ""  # runs to the end of the generation
    assert [m.family for m in markups_for(_Tokenizer("llama3_json"))] == ["llama3_json", "llama3_json",
                                                                          "json_tools", "qwen3_coder"]


@pytest.mark.parametrize("text, calls", [
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', [ARGS]),
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
     '{"name": "get_weather", "parameters": {"city": "Rome", "days": 1}}', [ARGS, {"city": "Rome", "days": 1}]),
    ("{'name': 'get_weather', 'parameters': {'city': 'Paris', 'days': '2'}}", []),  # not the bare-JSON start
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2', [ARGS]),  # cut off: repaired
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}} I will wait for it.', [ARGS]),
])
def test_llama3_bare_json_calls(text, calls):
    parser = _read("llama3_json", text, 5)
    assert [json.loads(c.arguments) for c in parser.calls] == calls
    if not calls:
        assert parser.shown == text


@pytest.mark.parametrize("family", ["json_tools", "qwen3_coder", "gemma4", "glm47", "kimi_k2"])
def test_the_enforced_families_grammar_accepts_what_their_parser_reads(family):
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    from inference.protocols.tool_choice import XGRAMMAR

    tag = xgr.get_model_structural_tag(XGRAMMAR[family], tools=TOOLS, tool_choice="required", reasoning="disabled")
    assert _is_grammar_accept_string(xgr.Grammar.from_structural_tag(tag.model_dump_json()), FAMILIES[family])


def test_the_enforced_tool_schema_is_always_checked_and_never_rewritten_where_arguments_are_text():
    """`strict: false` would leave a tool's arguments free under the grammar:
    it is dropped. Bounded JSON strings get the parse-safe pattern, but not in
    families whose argument values are raw text (a code parameter keeps its
    newlines and quotes). Schemas deeper than the request bounds are refused."""
    from core.limits import Limits
    from inference.protocols.errors import RequestError
    from inference.protocols.tool_choice import _checked

    code = {"type": "function", "function": {"name": "write", "strict": False, "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "maxLength": 200}}}}}
    json_family = _checked(code, 0, "qwen_3", Limits())["function"]
    assert "strict" not in json_family and "pattern" in json_family["parameters"]["properties"]["code"]
    raw = _checked(code, 0, "qwen_3_coder", Limits())["function"]["parameters"]["properties"]["code"]
    assert raw == {"type": "string", "maxLength": 200}
    deep: dict = {"type": "object"}
    for _ in range(80):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(RequestError) as refused:
        _checked({"type": "function", "function": {"name": "d", "parameters": deep}}, 3, "qwen_3", Limits())
    assert refused.value.param == "tools[3].function.parameters"


@pytest.mark.parametrize("arguments", ['{"city": "a\\"}b", "days": 2}', '{"city":"x\\\\\\"]y","days":2}',
                                       '{"city": "{[}", "days": 2}'])
def test_arguments_stream_as_read_escapes_and_brackets_in_strings_included(arguments):
    from inference.protocols.toolcalls import balanced_end

    assert balanced_end(arguments + "} tail") == len(arguments)
    text = 'On it. <tool_call>{"name": "get_weather", "arguments": ' + arguments + "}</tool_call>"
    streamed, whole = OutputParser(tools=TOOLS), OutputParser(tools=TOOLS)
    for ch in text:
        streamed.feed(ch)
    streamed.finish()
    whole.feed(text)
    whole.finish()
    deltas = streamed.take_deltas()
    assert deltas[0].name == "get_weather" and deltas[-1].done and len(deltas) > 5
    canonical = json.dumps(json.loads(arguments), ensure_ascii=False)
    assert "".join(d.arguments for d in deltas) == canonical == streamed.calls[0].arguments
    assert whole.calls[0].arguments == canonical  # one reading, however the text was cut


class _Model:
    """What tool_choice.spec reads of a loaded model: its tokenizer (a `<tool_call>` JSON template, no thinking)."""

    class _Tok:
        chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}<tool_call>{{ call }}</tool_call>"

        def get_vocab(self):
            return {}

    def __init__(self):
        self.tokenizer = self._Tok()
        self.model_id = "fake"


def test_a_strict_tool_under_auto_leaves_prose_free_but_checks_a_call():
    """The grammar tool_choice.spec builds for `auto` with a strict tool: text
    is free; a call, once started, must name an offered tool with valid arguments."""
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    from core.limits import Limits
    from inference.protocols.tool_choice import spec

    strict = {"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}
    made = spec({"tool_choice": "auto", "tools": [strict]}, [strict], _Model(), "closed", Limits())
    grammar = xgr.Grammar.from_structural_tag(made.source)
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    assert _is_grammar_accept_string(grammar, "It is sunny in Paris.")
    assert _is_grammar_accept_string(grammar, good)
    assert not _is_grammar_accept_string(grammar, good.replace('"days": 2', '"days": "two"'))
    assert not _is_grammar_accept_string(grammar, good.replace("get_weather", "delete_everything"))


@pytest.mark.parametrize("family", ["llama3_json", "mistral"])
def test_a_markup_with_no_end_tag_keeps_a_whole_call_when_the_reply_is_cut(family):
    """Llama 3's bare JSON and Mistral's calls run to the end of the generation, so a cut reply (a stop
    sequence after the call, or the token limit) is read without the repair pass: a call written whole is a
    call; one cut in its arguments is neither a call nor content (never closed up with made-up values)."""
    for text, calls in [(FAMILIES[family], [ARGS]), (FAMILIES[family][:-5], []),
                        (FAMILIES[family] + (" Let me check." if family == "llama3_json" else ""), [ARGS])]:
        parser = OutputParser(tools=TOOLS, markups=markups_for(_Tokenizer(family)))
        out = parser.feed(text) + parser.finish(cut=True)
        assert [json.loads(c.arguments) for c in parser.calls] == calls, text
        assert not any(c.cut for c in parser.calls) and "".join(p.text for p in out).strip() == ""


@pytest.mark.parametrize("family", ["glm47", "kimi_k2", "gemma4"])
def test_a_call_whose_end_tag_never_came_is_no_call_when_the_reply_is_cut(family):
    """A family with an end tag whose call the token limit or a stop sequence cut before that tag: its parser
    may read the truncated text (GLM's takes the members before the cut), but it is no call to run."""
    text = FAMILIES[family]
    markup = markups_for(_Tokenizer(family))[0]
    cut_at = text.index(markup.end) - 4 if markup.end in text else len(text) - 4
    parser = OutputParser(tools=TOOLS, markups=markups_for(_Tokenizer(family)))
    out = parser.feed(text[:cut_at]) + parser.finish(cut=True)
    assert [c for c in parser.calls if not c.cut] == [] and "".join(p.text for p in out).strip() == ""
