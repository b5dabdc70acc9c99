"""Anthropic Messages, the request: it becomes a chat turn on the shared path
(same template, tools, grammar, sampler and cache as chat completions). The
reply is rendered by `anthropic_reply.py`."""
from __future__ import annotations

import json
import re
import uuid

from inference.protocols import unhonoured
from inference.protocols.chat import AUDIO_PARTS
from inference.protocols.errors import RequestError
from inference.protocols.params import MAX_STOP_SEQUENCES, SAMPLING

# The chat-side fields Messages requests may carry besides their own (temperature, top_p and
# top_k are Messages fields too).
EXTRAS = (*(f for f in SAMPLING if f not in ("temperature", "top_p", "top_k")),
          "session_id", "prompt_cache_key", "response_format", "structured_outputs", "guided_grammar",
          "guided_regex", "guided_choice", "chat_template_kwargs", "adapter", "hlg", "speculative")


def _text_blocks(value, where: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a string or a list of text blocks", where)
    texts = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise RequestError(f"{where}[{i}] must be a text block", f"{where}[{i}]")
        texts.append(block["text"])
    return "\n\n".join(texts)


def _refuse_media(block: dict, where: str) -> None:
    kind = block.get("type")
    if not isinstance(kind, str):
        raise RequestError(f"{where}.type must be a string", where)
    if kind in AUDIO_PARTS:
        raise RequestError("the Messages protocol has no audio input; send audio to /v1/chat/completions "
                           "as an input_audio part", where)


def _image_part(block: dict, where: str) -> dict:
    """An `image` block as the chat part the shared path reads: a base64
    source (its `media_type` an image type, as the protocol requires; the
    bytes themselves tell Pillow their format) becomes a data: URL, a url
    source stays a URL."""
    source = block.get("source")
    if not isinstance(source, dict):
        source = {}
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type")
        if not isinstance(media, str) or not re.fullmatch(r"image/[\w.+-]+", media.strip()):
            raise RequestError(f"{where}.source.media_type must name an image type (image/png, image/jpeg, "
                               f"image/gif, image/webp, …), not {media!r}", f"{where}.source.media_type")
        url = f"data:{media.strip()};base64,{source['data']}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise RequestError(f"{where}.source must be {{\"type\": \"base64\", \"media_type\": …, \"data\": …}} or "
                           "{\"type\": \"url\", \"url\": …}", where)
    return {"type": "image_url", "image_url": {"url": url}, "_at": where}


def _content(parts: list[dict]):
    """Text and image parts as message content: a string when there is no image."""
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _tool_result_content(block: dict, where: str):
    content = block.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of blocks", where)
    parts: list[dict] = []
    for i, part in enumerate(content):
        at = f"{where}.content[{i}]"
        if not isinstance(part, dict):
            raise RequestError(f"{at} must be a block", at)
        _refuse_media(part, at)
        if part.get("type") == "image":
            parts.append(_image_part(part, at))
            continue
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise RequestError(f"{at} must be a text or image block", at)
        parts.append({"type": "text", "text": ("\n" if parts else "") + part["text"]})
    return _content(parts)


def _messages(raw) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages required", "messages")
    out: list[dict] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise RequestError(f"{where}.role must be 'user', 'assistant' or 'system'", f"{where}.role")
        role, content = m["role"], m.get("content")
        if role == "system":  # agents (Claude Code) send these mid-conversation: a system turn in place
            out.append({"role": "system", "content": _text_blocks(content, f"{where}.content")})
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise RequestError(f"{where}.content must be a string or a list of content blocks", where)
        parts: list[dict] = []
        calls: list[dict] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            if not isinstance(block, dict):
                raise RequestError(f"{at} must be a content block", at)
            kind = block.get("type")
            _refuse_media(block, at)
            if kind == "text" and isinstance(block.get("text"), str):
                parts.append({"type": "text", "text": block["text"]})
            elif kind == "image" and role == "user":
                parts.append(_image_part(block, at))
            elif kind == "image":
                raise RequestError(f"{at}: image blocks are only allowed in user messages (and inside a "
                                   f"tool_result block), and {where} is an {role} message", at)
            elif kind in ("thinking", "redacted_thinking"):
                continue  # earlier turns' thinking is not replayed
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    raise RequestError(f"{at} needs a name and an input object", at)
                calls.append({"id": str(block.get("id") or "toolu_" + uuid.uuid4().hex[:24]), "type": "function",
                              "function": {"name": block["name"],
                                           "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
            elif kind == "tool_result" and role == "user":
                if parts:  # keep the order the client wrote
                    out.append({"role": "user", "content": _content(parts)})
                    parts = []
                if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
                    raise RequestError(f"{at}.tool_use_id required: the id of the tool_use block this answers",
                                       f"{at}.tool_use_id")
                result = _tool_result_content(block, at)
                if block.get("is_error"):
                    result = [{"type": "text", "text": "Error: "}, *result] if isinstance(result, list) \
                        else "Error: " + result
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
            else:
                raise RequestError(f"{at}: unsupported content block type {kind!r} in {role} messages", at)
        if role == "assistant":
            if parts or calls:
                msg: dict = {"role": "assistant", "content": _content(parts)}
                if calls:
                    msg["tool_calls"] = calls
                out.append(msg)
        elif parts:
            out.append({"role": "user", "content": _content(parts)})
    return out


def _tools(raw) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RequestError("tools must be a list", "tools")
    tools = []
    for i, tool in enumerate(raw):  # server tools (web_search, …) have a type of their own: dropped
        if isinstance(tool, dict) and tool.get("type", "custom") == "custom" and \
                not isinstance(tool.get("input_schema"), dict):
            raise RequestError(f"tools[{i}].input_schema must be a JSON schema object (a tool the client runs "
                               "needs a name and an input_schema)", f"tools[{i}].input_schema")
        if isinstance(tool, dict) and isinstance(tool.get("name"), str) and isinstance(tool.get("input_schema"), dict):
            function = {"name": tool["name"], "description": tool.get("description", ""),
                        "parameters": tool["input_schema"]}
            if isinstance(tool.get("strict"), bool):  # a strict tool's input is enforced (tool_choice.py)
                function["strict"] = tool["strict"]
            tools.append({"type": "function", "function": function})
    return tools or None


def _tool_choice(raw):
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(raw.get("name"), str):
        return {"type": "function", "function": {"name": raw["name"]}}
    raise RequestError("tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or "
                       "{\"type\": \"tool\", \"name\": …}", "tool_choice")


# Anthropic's output_config.effort levels, as the chat side's reasoning_effort (which has no `max`).
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}


def _prefill(raw: list, messages: list[dict]) -> bool:
    """Whether the conversation ends with an assistant message for the reply
    to continue (a prefill): the reply then goes on from its text and holds
    only what follows it. An empty one is no prefill, and is dropped."""
    last, where = raw[-1], f"messages[{len(raw) - 1}]"
    content = last.get("content")
    if last.get("role") != "assistant" or not messages or messages[-1]["role"] != "assistant" or (
            isinstance(content, list) and all(b.get("type") in ("thinking", "redacted_thinking") for b in content)):
        return False
    if messages[-1].get("tool_calls"):
        raise RequestError(f"{where}: a final assistant message with tool_use blocks cannot be continued; send "
                           "their tool_result blocks in a user message", f"{where}.content")
    text = messages[-1]["content"]
    if not text:
        messages.pop()
        return False
    if text != text.rstrip():
        raise RequestError(f"{where}.content: final assistant content cannot end with trailing whitespace",
                           f"{where}.content")
    return True


def _format(fmt, where: str) -> dict | None:
    """An output format ({"type": "json_schema", "schema": …}) as the chat side's response_format."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise RequestError(f"{where} must be {{\"type\": \"json_schema\", \"schema\": {{…}}}}", where)
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def _output_format(body: dict) -> tuple[dict | None, str | None]:
    """The chat side's response_format and reasoning_effort: `output_config`
    (`format`, `effort`), or the structured-outputs beta's `output_format`,
    the same thing under its earlier name (both: they must agree)."""
    response_format, effort = _output_config(body.get("output_config"))
    beta = _format(body.get("output_format"), "output_format")
    if beta is not None and response_format is not None and beta != response_format:
        raise RequestError("output_format and output_config.format differ; send one (output_format is the "
                           "structured-outputs beta's name for output_config.format)", "output_format")
    return beta or response_format, effort


def _output_config(raw) -> tuple[dict | None, str | None]:
    """`output_config` as (the chat side's response_format, its reasoning_effort):
    `format` {"type": "json_schema", "schema": …} is enforced by grammar, as
    `response_format` is on chat completions."""
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise RequestError("output_config must be an object, e.g. {\"format\": {\"type\": \"json_schema\", "
                           "\"schema\": {…}}}", "output_config")
    unknown = sorted(set(raw) - {"format", "effort"})
    if unknown:
        raise RequestError(f"output_config.{unknown[0]} is not supported (output_config takes format and effort)",
                           f"output_config.{unknown[0]}")
    effort = raw.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise RequestError("output_config.effort must be one of " + ", ".join(EFFORTS), "output_config.effort")
    return _format(raw.get("format"), "output_config.format"), EFFORTS.get(effort) if effort else None


def to_chat_body(body: dict) -> dict:
    """The Messages request as the chat turn the shared path builds.
    `max_tokens` is required, as on Anthropic (count_tokens reads none)."""
    if "max_tokens" not in body:
        raise RequestError("max_tokens: Field required", "max_tokens")
    if body["max_tokens"] is None:
        raise RequestError("max_tokens: Input should be a valid integer", "max_tokens")
    return _chat_body(body)


def _chat_body(body: dict) -> dict:
    unhonoured.refuse(body, unhonoured.MESSAGES)
    if "logit_bias" in body:
        raise RequestError("logit_bias is not part of the Messages protocol; use /v1/chat/completions",
                           "logit_bias")
    messages = _messages(body.get("messages"))
    prefill = _prefill(body["messages"], messages)
    if body.get("system") is not None:
        messages.insert(0, {"role": "system", "content": _text_blocks(body["system"], "system")})
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise RequestError("stop_sequences must be a list of strings", "stop_sequences")
    if stops and len(stops) > MAX_STOP_SEQUENCES:  # checked here so the message names this protocol's field
        raise RequestError(f"stop_sequences takes at most {MAX_STOP_SEQUENCES} sequences", "stop_sequences")
    chat: dict = {"messages": messages, "stream": body.get("stream", False)}
    for name in ("max_tokens", "temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if stops:
        chat["stop"] = stops
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:  # one that asks for a call needs tools (chat.tools_for)
        chat["tool_choice"] = choice
    if tools:
        chat["tools"] = tools
        if isinstance(body.get("tool_choice"), dict) and body["tool_choice"].get("disable_parallel_tool_use") is True:
            chat["parallel_tool_calls"] = False  # at most one tool_use block
    for name in EXTRAS:
        if name in body:
            chat[name] = body[name]
    response_format, effort = _output_format(body)
    field = "output_format" if body.get("output_format") is not None else "output_config.format"
    if response_format is not None:
        if "response_format" in chat:
            raise RequestError(f"send {field} or response_format, not both", field)
        if prefill:
            raise RequestError(f"{field} describes a whole message, and the final assistant message (a prefill) "
                               "begins one already: send one or the other", field)
        chat["response_format"] = response_format
    if effort is not None:
        chat["reasoning_effort"] = effort
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") in
                                     ("enabled", "disabled", "adaptive")):
        raise RequestError("thinking must be {\"type\": \"enabled\" | \"disabled\" | \"adaptive\", …}", "thinking")
    if thinking is not None:
        kwargs = chat.get("chat_template_kwargs")
        chat["chat_template_kwargs"] = {**(kwargs if isinstance(kwargs, dict) else {}),
                                        "enable_thinking": thinking["type"] != "disabled"}
        budget = _budget(thinking)
        if budget is not None:
            chat["thinking_budget"] = budget  # a hard bound here (think.py)
    if prefill:
        if thinking is not None and thinking["type"] == "enabled":
            raise RequestError("thinking cannot be enabled when the final message is an assistant message to "
                               "continue (a prefill)", "thinking")
        chat["continue_final_message"] = True  # the shared path leaves the message open (chat.continues)
    return chat


def _budget(thinking: dict) -> int | None:
    """`thinking.budget_tokens`: a whole number of tokens. Anthropic also wants
    it below max_tokens; here a larger one is taken (it never binds), as
    clients send 1024 with a smaller max_tokens."""
    budget = thinking.get("budget_tokens")
    if budget is None or thinking["type"] == "disabled":
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise RequestError("thinking.budget_tokens must be a whole number of tokens, 1 or more",
                           "thinking.budget_tokens")
    return budget


def count_body(body: dict) -> dict:
    """count_tokens takes a Messages request without max_tokens (nor a tool
    choice or strict tools: counting compiles no grammar)."""
    chat = _chat_body({k: v for k, v in body.items() if k not in ("stream", "max_tokens", "tool_choice")})
    for tool in chat.get("tools") or []:
        tool["function"].pop("strict", None)
    chat.pop("response_format", None)  # checked above; an output format changes no prompt token
    return chat
