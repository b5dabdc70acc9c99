"""Which tool-call markup a model writes, and how to read it.

Hearth reads two families itself, with its JSON repair pass
(`toolcalls.parse_block`): `<tool_call>` JSON (Qwen 3, Hermes, the demo
model) and Qwen3-Coder's `<tool_call><function=…>` XML. Every other family
mlx-lm knows (Gemma 4 sentinels, GLM `<arg_key>`/`<arg_value>`, MiniCPM5
`<function name=…>`, Mistral `[TOOL_CALLS]`, pythonic `[f(x=1)]`, Kimi,
MiniMax, …) is read by mlx-lm's own parser for it (`mlx_lm.tool_parsers`,
the one its tokenizer loader inferred for the model), with Hearth's repair
pass as the fallback for text that parser refuses.

Llama 3.1 to 3.3 have no tool-call tags: their template asks for a bare
JSON object `{"name": …, "parameters": {…}}` (several separated by `;`),
sometimes after `<|python_tag|>`. mlx-lm has no parser for it, so Hearth
recognises the template by that instruction and reads the JSON itself
(`LLAMA3`): a reply from `{"name"` to its end is read as calls.

`Markup.end` may be empty (Mistral, Llama 3): the call then runs to the end
of the generation.
"""
from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass

from inference.protocols.toolcalls import ToolCall, new_call, parse_block

# (text between the tags, the offered tools, whether the end tag came, whether the repair pass may read it)
Parse = Callable[[str, "list[dict] | None", bool, bool], "list[ToolCall] | None"]


@dataclass(frozen=True)
class Markup:
    start: str
    end: str
    parse: Parse  # -> calls or None; without repair only calls written whole (a reply cut after them)
    family: str  # mlx-lm's name for it


def _hearth_json(body: str, tools, closed: bool, repair: bool) -> list[ToolCall] | None:
    return parse_block(body, tools) if repair or closed else None


def _hearth_qwen_xml(body: str, tools, closed: bool, repair: bool) -> list[ToolCall] | None:
    if not (repair or closed):
        return None
    return parse_block("<function=" + body + ("</function>" if closed else ""), tools)


HEARTH = (Markup("<tool_call>", "</tool_call>", _hearth_json, "json_tools"),
          Markup("<function=", "</function>", _hearth_qwen_xml, "qwen3_coder"))
OWN_FAMILIES = frozenset({"json_tools", "qwen3_coder"})  # what HEARTH reads


def _llama3_calls(text: str, tools, repair: bool = True) -> list[ToolCall] | None:
    """One or more `{"name", "parameters"}` objects, separated by `;` or space; without `repair`, only
    objects written whole (none when the text is not all calls)."""
    decoder, at = json.JSONDecoder(), 0
    calls: list[ToolCall] = []
    while True:
        while at < len(text) and text[at] in " \t\r\n;":
            at += 1
        if at == len(text):
            break
        try:
            obj, at = decoder.raw_decode(text, at)
        except ValueError:  # not strict JSON: the repair pass may read a call; prose after calls is let go
            if not repair:  # the calls written whole before it
                return calls or None
            rest = parse_block(text[at:], tools)
            return (calls + (rest or [])) or None
        found = parse_block(json.dumps(obj), tools) if isinstance(obj, dict) else None
        if not found:
            return None
        calls += found
    return calls or None


def _llama3_after_name(body: str, tools, closed: bool, repair: bool) -> list[ToolCall] | None:
    return _llama3_calls('{"name"' + body, tools, repair)


def _llama3_after_tag(body: str, tools, closed: bool, repair: bool) -> list[ToolCall] | None:
    return _llama3_calls(body, tools, repair)


LLAMA3 = (Markup('{"name"', "", _llama3_after_name, "llama3_json"),
          Markup("<|python_tag|>", "", _llama3_after_tag, "llama3_json"))
# The instruction Llama 3.1-3.3 templates give a model for its calls.
_LLAMA3_HINT = '"parameters": dictionary of argument name and its value'


def family_markup(family: str) -> Markup:
    """The markup of one of mlx-lm's tool-call families, read by its parser."""
    module = importlib.import_module(f"mlx_lm.tool_parsers.{family}")

    def parse(body: str, tools, closed: bool, repair: bool) -> list[ToolCall] | None:
        try:
            parsed = module.parse_tool_call(body, tools)
        except Exception:  # refused (or truncated): Hearth's repair pass may still read it
            return parse_block(body, tools) if repair else None
        return [_call(c) for c in (parsed if isinstance(parsed, list) else [parsed])] or None

    return Markup(module.tool_call_start, module.tool_call_end, parse, family)


def _call(parsed: dict) -> ToolCall:
    arguments = parsed.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {"value": arguments}
    return new_call(str(parsed.get("name")), arguments if isinstance(arguments, dict) else {"value": arguments})


def family_of(tokenizer) -> str | None:
    """The tool-call family mlx-lm inferred for this tokenizer, or None."""
    parser = getattr(tokenizer, "_tool_parser", None)
    module = getattr(parser, "__module__", "") or ""
    return module.rsplit(".", 1)[-1] if module.startswith("mlx_lm.tool_parsers.") else None


@functools.cache
def markups_for(tokenizer) -> tuple[Markup, ...]:
    """What to look for in this model's output: its own family's markup
    first, then Hearth's two (those whose start tag the family does not use)."""
    family = family_of(tokenizer)
    template = getattr(tokenizer, "chat_template", None)
    if family is None and isinstance(template, str) and _LLAMA3_HINT in template:
        return (*LLAMA3, *HEARTH)
    if family is None or family in OWN_FAMILIES:
        return HEARTH
    own = family_markup(family)
    return (own, *(m for m in HEARTH if m.start != own.start))
