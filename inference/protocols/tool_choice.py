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

from typing import Any, Literal

from inference.engine.grammar import GrammarSpec
from inference.engine.loader import LoadedModel
from inference.protocols import chat, markup, structured

QWEN_3, QWEN_3_CODER = "qwen_3", "qwen_3_coder"
MAX_WHITESPACE = 16  # a run of whitespace in the arguments: room for indented JSON, never an endless pad


# mlx-lm's family name -> xgrammar's structural tag for the same markup (test_tool_choice checks that the
# tag accepts what the family's parser reads)
XGRAMMAR = {"json_tools": QWEN_3, "qwen3_coder": QWEN_3_CODER, "glm47": "glm_4_7", "gemma4": "gemma_4",
            "kimi_k2": "kimi"}


def family(model: LoadedModel) -> str | None:
    """xgrammar's name for the model's tool-call markup, when Hearth reads it too."""
    known = markup.family_of(model.tokenizer)
    if known is not None:
        return XGRAMMAR.get(known)
    template = getattr(chat.hf_tokenizer(model), "chat_template", None)
    template = template if isinstance(template, str) else ""
    if "<function=" in template:
        return QWEN_3_CODER
    if "<tool_call>" in template or "<tool_call>" in model.tokenizer.get_vocab():
        return QWEN_3
    return None


def forces(body: dict, tools: list[dict] | None) -> bool:
    """Whether the request asks for an enforced choice: a call required or
    named, or a strict tool."""
    if not tools:
        return False
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        return True
    return any((t.get("function") or {}).get("strict") is True for t in tools)


def spec(body: dict, tools: list[dict], model: LoadedModel, in_reasoning: bool,
         thinking: bool) -> GrammarSpec | None:
    """The structural tag that enforces the request's tool choice (None: the
    model's family is not one this can enforce). `in_reasoning`: the prompt
    left a <think> open; `thinking`: the request turned thinking on (the
    model may open one itself)."""
    import xgrammar as xgr

    kind = family(model)
    if kind is None:
        return None
    raw = body.get("tool_choice")
    choice: Any = raw if raw == "required" or isinstance(raw, dict) else "auto"
    reasoning: Literal["enabled", "disabled", "auto"]
    if in_reasoning:
        reasoning = "enabled"  # the prompt left <think> open: it closes before any call
    else:  # a thinking model asked to think may write a whole <think> block first; otherwise none
        reasoning = "auto" if thinking and chat.thinks(model) else "disabled"
    tools = [_bounded(t) for t in tools]  # arguments that always parse (see structured.bounded_strings)
    tag = xgr.get_model_structural_tag(kind, tools=list[Any](tools), tool_choice=choice, reasoning=reasoning,
                                       parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
                                       max_whitespace_cnt=MAX_WHITESPACE)
    return GrammarSpec("structural_tag", tag.model_dump_json())


def _bounded(tool: dict) -> dict:
    function = tool.get("function") or {}
    if not isinstance(function.get("parameters"), dict):
        return tool
    return {**tool, "function": {**function, "parameters": structured.bounded_strings(function["parameters"])}}


def unenforced(model: LoadedModel) -> str:
    return ("tool_choice not enforced: this model's tool-call markup is not one the server can constrain "
            f"({model.model_id}); the choice is advisory")


def offered_names(tools: list[dict] | None) -> frozenset:
    return frozenset((t.get("function") or {}).get("name") for t in tools or [])
