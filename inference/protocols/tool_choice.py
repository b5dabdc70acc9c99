"""`tool_choice` enforced: a grammar over the model's own tool-call markup.

`"required"`, a named function (Anthropic's `any` and `{type: tool}` and the
Responses `required` arrive here as those), and `"auto"` with a `strict: true`
tool constrain generation with xgrammar's structural tag for the model's
tool-call family (`xgrammar.get_model_structural_tag`): once a call starts
it must name an offered tool and its arguments must match that tool's
schema; `required` makes at least one call, a named choice exactly that
one; `parallel_tool_calls: false` stops after the first. The reasoning
block the template leaves open (or lets the model open) stays free text.

xgrammar knows the markup of many families; this uses the ones Hearth's
output parser reads (`toolcalls.py`): `<tool_call>` JSON (Qwen 3, Hermes,
the demo model) and Qwen3-Coder's `<function=…>` XML. For another family,
or a model with no tool-call markup in its template, the choice is not
enforced and the reply says so in a `Warning` header.
"""
from __future__ import annotations

import functools
from typing import Any, Literal

from core import jsonbody
from core.limits import Limits
from inference.engine.grammar import MAX_WHITESPACE, GrammarSpec
from inference.engine.loader import LoadedModel
from inference.protocols import chat, harmony, markup, structured
from inference.protocols.errors import RequestError

QWEN_3, QWEN_3_CODER, HARMONY = "qwen_3", "qwen_3_coder", "harmony"


# mlx-lm's family name -> xgrammar's structural tag for the same markup (test_tool_families checks that the
# tag accepts what the family's parser reads)
XGRAMMAR = {"json_tools": QWEN_3, "qwen3_coder": QWEN_3_CODER, "glm47": "glm_4_7", "gemma4": "gemma_4",
            "kimi_k2": "kimi"}
RAW_ARGUMENTS = frozenset({QWEN_3_CODER, "glm_4_7"})  # argument values written as raw text, not JSON


def family(model: LoadedModel) -> str | None:
    """xgrammar's name for the model's tool-call markup, when Hearth reads it too."""
    if harmony.is_harmony(model.tokenizer):
        return HARMONY
    return _family(model.tokenizer)


@functools.cache
def _family(tokenizer) -> str | None:  # once per loaded tokenizer: get_vocab() builds a dict
    known = markup.family_of(tokenizer)
    if known is not None:
        return XGRAMMAR.get(known)
    template = getattr(getattr(tokenizer, "_tokenizer", tokenizer), "chat_template", None)
    template = template if isinstance(template, str) else ""
    if "<function=" in template:
        return QWEN_3_CODER
    if "<tool_call>" in template or "<tool_call>" in tokenizer.get_vocab():
        return QWEN_3
    return None


def forces(body: dict, tools: list[dict] | None) -> bool:
    """Whether the request asks for an enforced choice: a call required or
    named, or a strict tool."""
    if not tools:
        return False
    return demands_a_call(body, tools) or any((t.get("function") or {}).get("strict") is True for t in tools)


def demands_a_call(body: dict, tools: list[dict] | None) -> bool:
    """Whether the reply must be a call (`required`, or a named function): an
    output format the request also sends then applies to the message after it."""
    choice = body.get("tool_choice")
    return bool(tools) and (choice == "required" or isinstance(choice, dict))


def spec(body: dict, tools: list[dict], model: LoadedModel, think: str | None, limits: Limits) -> GrammarSpec | None:
    """The structural tag that enforces the request's tool choice (None: the
    model's family is not one this can enforce). `think` is how the prompt
    leaves the <think> channel (chat.build_prompt): open, it closes before any
    call; closed, there is none; otherwise a thinking model may write one."""
    import xgrammar as xgr

    kind = family(model)
    if kind is None:
        return None
    raw = body.get("tool_choice")
    choice: Any = raw if raw == "required" or isinstance(raw, dict) else "auto"
    reasoning: Literal["enabled", "disabled", "auto"]
    if kind == HARMONY:  # a call demanded comes at once; otherwise the analysis channel stays open to it
        reasoning = "disabled" if choice != "auto" else "enabled"
    elif think == "open":
        reasoning = "enabled"
    else:
        reasoning = "auto" if think is None and chat.thinks(model) else "disabled"
    tools = [_checked(t, i, kind, limits) for i, t in enumerate(tools)]
    try:
        tag = xgr.get_model_structural_tag(kind, tools=list[Any](tools), tool_choice=choice, reasoning=reasoning,
                                           parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
                                           max_whitespace_cnt=MAX_WHITESPACE)
    except (ValueError, AssertionError, TypeError) as exc:  # e.g. two tools of one name
        raise RequestError(f"tools cannot be enforced: {exc}", "tools") from None
    return GrammarSpec("structural_tag", tag.model_dump_json())


def _checked(tool: dict, index: int, kind: str, limits: Limits) -> dict:
    """A tool as the grammar gets it: its schema within the request bounds,
    always enforced (`strict: false` would leave its arguments free), JSON
    strings bounded so they parse (not where arguments are raw text)."""
    function = {k: v for k, v in (tool.get("function") or {}).items() if k != "strict"}
    parameters = function.get("parameters")
    if isinstance(parameters, dict):
        where = f"tools[{index}].function.parameters"
        if jsonbody.depth(parameters) > limits.max_schema_depth:
            raise RequestError(f"{where} nests more than {limits.max_schema_depth} levels deep "
                               "(HEARTH_MAX_SCHEMA_DEPTH)", where, code="grammar_too_large")
        if kind not in RAW_ARGUMENTS:
            function["parameters"] = structured.bounded_strings(parameters)
    return {**tool, "function": function}


def unenforced(model: LoadedModel) -> str:
    return ("tool_choice not enforced: this model's tool-call markup is not one the server can constrain "
            f"({model.model_id}); the choice is advisory")


def offered_names(tools: list[dict] | None) -> frozenset:
    return frozenset((t.get("function") or {}).get("name") for t in tools or [])
