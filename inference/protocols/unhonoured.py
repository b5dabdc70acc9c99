"""The fields of OpenAI's and Anthropic's request bodies that Hearth does
not honour, one table per surface. A request that sends one asking for
something (a value other than the one that asks for nothing: null, false,
an empty list, the default) is refused with a 400 that names the field and
says why, instead of being answered as if the field were not there.

Fields that ask for nothing of a local server (`user`, `metadata`,
`safety_identifier`, Anthropic's `metadata.user_id`: labels for a hosted
service's dashboards and abuse checks; prompt-cache hints the cache meets by
itself) are listed in `LABELS` and pass. OpenAI's `verbosity` is honoured
elsewhere (chat.with_verbosity).
A field in neither list nor read by the protocol is ignored, as the
reference contract says; the route names it in the
`X-Hearth-Ignored-Fields` header (`ignored`), so nothing is dropped
without a word.

No Django here."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from inference.protocols.errors import RequestError

Asks = Callable[[Any], bool]  # whether a value asks for something


def is_set(value: Any) -> bool:
    return value not in (None, False, "", [])


def _present(value: Any) -> bool:  # for an object whose mere presence turns a feature on ({} = defaults)
    return value is not None


def other_than(*fine: Any) -> Asks:
    return lambda value: value is not None and value not in fine


def _not_text_only(value: Any) -> bool:
    return value is not None and value != ["text"]


def _more_than_one(value: Any) -> bool:
    return value is not None and value != 1


# Built-in tools (web search, file search, code interpreter, computer use) never run here (a request that
# lists one has it left out, and named in the ignored-fields header: `dropped_tools`), so asking to include
# their outputs asks for nothing; encrypted reasoning is built (responses_reply: `encrypted_content`).
RESPONSES_INCLUDABLE = frozenset({
    "reasoning.encrypted_content", "web_search_call.results", "web_search_call.action.sources",
    "file_search_call.results", "code_interpreter_call.outputs", "computer_call_output.output.image_url"})


def _includes_unbuilt(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return True
    return any(v not in RESPONSES_INCLUDABLE for v in value)


_ONE_TIER = "a local server has one service tier"
_OPENAI_HOSTED: dict[str, tuple[Asks, str]] = {  # OpenAI's service options, on chat and Responses alike
    "service_tier": (other_than("auto", "default"), _ONE_TIER),
    "moderation": (is_set, "there is no moderation model here"),
}

CHAT: dict[str, tuple[Asks, str]] = {
    "audio": (is_set, "no audio output is generated (send audio in; text comes out)"),
    "modalities": (_not_text_only, "only text is generated: modalities must be [\"text\"]"),
    "prediction": (is_set, "predicted outputs are not used; speculative decoding drafts for itself"),
    "web_search_options": (_present, "there is no web search here"),
    "store": (is_set, "chat completions are not stored (the Responses API stores turns)"),
    "functions": (is_set, "the deprecated functions field is not read: send tools"),
    "function_call": (is_set, "the deprecated function_call field is not read: send tool_choice"),
    **_OPENAI_HOSTED,
}

COMPLETIONS: dict[str, tuple[Asks, str]] = {
    "best_of": (_more_than_one, "best_of is not built: ask for n choices and pick"),
    "echo": (is_set, "the prompt is not echoed"),
    "suffix": (is_set, "no fill-in-the-middle: suffix is not read"),
}

RESPONSES: dict[str, tuple[Asks, str]] = {
    "background": (is_set, "no background mode: stream the response (a dropped stream resumes)"),
    "background_options": (is_set, "no background mode"),
    "conversation": (is_set, "no Conversations API: chain turns with previous_response_id"),
    "context_management": (is_set, "no server-side context management"),
    "truncation": (other_than("disabled"), "input is never truncated: a turn over the context is a 400"),
    "include": (_includes_unbuilt, "include may name reasoning.encrypted_content (and built-in tools' outputs, "
                                   "which never run here); logprobs and input image URLs are not returned"),
    "top_logprobs": (is_set, "logprobs are not returned on Responses: use /v1/chat/completions"),
    "prompt": (lambda value: isinstance(value, dict), "no stored prompt templates"),  # {"id": "pmpt_..."}
    **_OPENAI_HOSTED,
    "access_programs": (is_set, "no access programs here"),
    "image": (is_set, "no image generation"),
    "stream_options": (lambda value: value is not None and not (
        isinstance(value, dict) and set(value) <= {"include_usage", "include_obfuscation"}
        and value.get("include_obfuscation") is not True),
        "no obfuscation padding here (include_obfuscation: true); the usage is always in response.completed"),
    "response_format": (is_set, "the output format of a Responses request is text.format"),
    "structured_outputs": (is_set, "the output format of a Responses request is text.format"),
}

MESSAGES: dict[str, tuple[Asks, str]] = {
    "container": (is_set, "no code-execution containers"),
    "mcp_servers": (is_set, "no MCP connector: run the tools on the client"),
    "inference_geo": (is_set, "inference runs on this machine"),
    "speed": (other_than("standard"), "one speed here"),
    "service_tier": (other_than("auto", "standard_only"), _ONE_TIER),
    "diagnostics": (is_set, "no cache diagnostics: /stats reports the prompt cache"),
    "workspace_id": (is_set, "no workspaces here"),
}

EMBEDDINGS: dict[str, tuple[Asks, str]] = {
    "dimensions": (is_set, "the model's embedding size is fixed"),
}

# Accepted, change nothing (and are not reported as ignored): labels for a hosted service, and prompt-cache
# hints the cache meets by itself (it keeps every prefix it has room for, in memory and then on the SSD tier,
# with no breakpoints needed).
LABELS = frozenset({"user", "metadata", "safety_identifier", "user_profile_id", "prompt_cache_retention",
                    "prompt_cache_options"})
SAFE_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]:]{1,64}")  # what a header may repeat of a client's field name
MOST_NAMED = 16


def refuse(body: dict, table: dict[str, tuple[Asks, str]]) -> None:
    """A 400 naming the first field of `table` the body sends asking for something."""
    for name, (asks, why) in table.items():
        if name in body and asks(body[name]):
            raise RequestError(f"{name} is not supported: {why}", name, code="unsupported_parameter")


def ignored(body: dict, known: Iterable[str], table: dict[str, tuple[Asks, str]]) -> list[str]:
    """The body's fields that nothing reads: neither `known` (the route's
    schema), nor `table` (passed because they asked for nothing), nor a label."""
    read = {*known, *table, *LABELS}
    return sorted(name for name in body if name not in read)


def dropped_tools(body: dict, surface: str) -> list[str]:
    """The built-in or server tools a Responses or Messages request lists,
    which never run here (`tools[2]:web_search`)."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            continue
        builtin = tool.get("type") != "function" if surface == "responses" else \
            not isinstance(tool.get("input_schema"), dict)
        if builtin:
            out.append(f"tools[{i}]:{tool.get('type') or tool.get('name') or '?'}")
    return out


def header_value(names: list[str]) -> str:
    """The names for a response header: only plain ones (a client's field name may hold anything, a line
    break included), at most MOST_NAMED of them."""
    plain = [n for n in names if SAFE_NAME.fullmatch(n)]
    shown = plain[:MOST_NAMED]
    rest = len(names) - len(shown)
    return ", ".join(shown + ([f"+{rest} more"] if rest else []))
