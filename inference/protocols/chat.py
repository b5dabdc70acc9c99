"""The chat turn every protocol builds on: messages normalized for chat
templates, tools, the thinking switch, and the rendered prompt."""
from __future__ import annotations

import functools
import json

from inference.engine.loader import LoadedModel
from inference.protocols.errors import RequestError
from inference.protocols.output import THINK_CLOSE, THINK_OPEN

ROLES = {"system", "developer", "user", "assistant", "tool"}
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
TOOL_CHOICES = ("none", "auto", "required")


def text_of(content, where: str) -> str:
    """Message content as one string: a string, null, or a list of parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content parts", where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "image", "input_image"):
            raise RequestError("model has no vision sidecar", f"{where}.content[{i}]")
        elif kind == "input_audio":
            raise RequestError("model has no audio tower", f"{where}.content[{i}]")
        else:
            raise RequestError(f"{where}.content[{i}] is not a text part", f"{where}.content[{i}]")
    return "".join(texts)


def _template_tool_calls(calls, where: str) -> list[dict]:
    """Assistant tool calls with `arguments` decoded: templates expect a mapping."""
    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{where}.tool_calls[{i}].function.name required", f"{where}.tool_calls[{i}]")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass  # left as the string the client sent
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def normalize_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages required", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(sorted(ROLES))}", f"{where}.role")
        msg = dict(m)
        msg["role"] = "system" if m["role"] == "developer" else m["role"]
        msg["content"] = text_of(m.get("content"), where)
        if m["role"] == "assistant":
            # `reasoning` is an alias; an explicit reasoning_content wins, even empty.
            if "reasoning_content" not in m and isinstance(m.get("reasoning"), str):
                msg["reasoning_content"] = m["reasoning"]
            if m.get("tool_calls"):
                msg["tool_calls"] = _template_tool_calls(m["tool_calls"], where)
        out.append(msg)
    return out


def tools_for(body: dict) -> list[dict] | None:
    """The request's function tools, or None when absent or tool_choice is "none".
    "auto", "required" and a named function are accepted and act as "auto"."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice is not None and not (choice in TOOL_CHOICES or (
            isinstance(choice, dict) and choice.get("type") == "function")):
        raise RequestError("tool_choice must be 'none', 'auto', 'required' or "
                           "{\"type\": \"function\", \"function\": {\"name\": …}}", "tool_choice")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of function tools", "tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}",
                               f"tools[{i}]")
    return None if choice == "none" else tools


def template_kwargs(body: dict) -> dict:
    """chat_template_kwargs, with reasoning_effort mapped onto enable_thinking
    unless the client set enable_thinking itself."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise RequestError("reasoning_effort must be one of "
                               + ", ".join(f"'{e}'" for e in REASONING_EFFORTS), "reasoning_effort")
        if "enable_thinking" not in kwargs:
            kwargs = {**kwargs, "enable_thinking": effort != "none"}
    return kwargs


def thinks(model: LoadedModel) -> bool:
    """Whether the model has a <think> channel worth parsing."""
    return _thinks(model.tokenizer)


@functools.cache
def _thinks(tokenizer) -> bool:  # once per loaded tokenizer: get_vocab() builds a dict
    template = getattr(tokenizer, "chat_template", None) or ""
    return THINK_OPEN in template or THINK_OPEN in tokenizer.get_vocab()


def build_prompt(model: LoadedModel, messages: list[dict], tools: list[dict] | None,
                 kwargs: dict) -> tuple[list[int], bool]:
    """Prompt tokens, and whether generation starts inside an open <think>."""
    # The Hugging Face tokenizer itself: mlx-lm's wrapper sets enable_thinking
    # for every tokenizer with think tokens, overriding the template's default.
    tokenizer = getattr(model.tokenizer, "_tokenizer", model.tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError("prompt build failed: this model has no chat template; use /v1/completions")
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                             **kwargs)
        tokens = tokenizer.encode(text, add_special_tokens=False)
    except Exception as exc:  # jinja errors, raise_exception() in templates
        raise RequestError(f"prompt build failed: {exc}") from None
    return tokens, text.rfind(THINK_OPEN) > text.rfind(THINK_CLOSE)
