"""The keys inside a request's objects, one table per surface: what each
object of OpenAI's and Anthropic's request bodies may hold (the keys of the
official SDKs' request types, and the few a server reads beside them), and
what becomes of each. `unhonoured.py` does the same for the top-level
fields; this is the level below (`response_format.json_schema.name`,
`messages[2].content[0].text`, `thinking.budget_tokens`).

A key is one of:
- READ: the protocol reads it;
- QUIET: a label, or a prompt-cache hint the cache meets by itself: it
  passes without a word (as `unhonoured.LABELS` at the top);
- Unread(asks): the SDK's, harmless, not read: named in the
  `X-Hearth-Ignored-Fields` header when `asks(value)`;
- (asks, why): not built: a 400 `unsupported_parameter` naming its path when
  `asks(value)`, as `unhonoured.refuse` answers at the top.
A key an object's table does not list exists nowhere: a 400
`unknown_parameter` naming its path (a typo would otherwise change nothing),
except in a chat's messages, where it is named in the header (`_named`).

Only objects are checked here; a value of the wrong type, an unknown `type`
or `role`, is left to the protocol's own reader, whose message says what
it takes. The walk is written here rather than with pydantic models of the
SDKs' types because the SDKs ship TypedDicts without the per-key fates, and
the protocols' readers keep their own messages for malformed values.

No Django here."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Union, cast

from inference.protocols.errors import RequestError
from inference.protocols.unhonoured import Asks, is_set, other_than

READ = "read"
QUIET = "quiet"


@dataclass(frozen=True)
class Unread:
    asks: Asks = lambda value: value is not None


Fate = Union[str, Unread, tuple[Asks, str]]


@dataclass(frozen=True)
class Obj:
    """An object: its keys' fates, and the objects or lists some keys hold;
    `others` is the fate of a key it does not list (None: unknown, a 400)."""
    keys: Mapping[str, Fate]
    inner: Mapping[str, Node] = field(default_factory=dict)
    others: Fate | None = None


@dataclass(frozen=True)
class Each:
    """A list, each item `item`."""
    item: Node


@dataclass(frozen=True)
class OneOf:
    """An object that is one of several by its `by` key (`type`, `role`);
    `default` when the key is absent. One of a kind not listed is left to
    the protocol's reader (it refuses it, or drops a built-in tool)."""
    kinds: Mapping[str, Node]
    by: str = "type"
    default: str | None = None


@dataclass(frozen=True)
class Fields:
    """The body itself: its top-level keys are unhonoured.py's; only the objects inside are walked here."""
    inner: Mapping[str, Node]


Node = Union[Obj, Each, OneOf, Fields]


def check(body: dict, spec: Fields) -> list[str]:
    """Refuse the first key inside `body`'s objects that is unknown, or not
    built and asking for something; the paths of the harmless unread ones."""
    unread: list[str] = []
    _walk(body, spec, "", unread)
    return unread


def _walk(value: Any, node: Node, path: str, unread: list[str]) -> None:
    if isinstance(node, Each):
        for i, item in enumerate(value if isinstance(value, list) else []):
            _walk(item, node.item, f"{path}[{i}]", unread)
        return
    if not isinstance(value, dict):
        return
    if isinstance(node, OneOf):
        kind = value.get(node.by, node.default)
        if isinstance(kind, str) and kind in node.kinds:
            _walk(value, node.kinds[kind], path, unread)
        return
    if isinstance(node, Obj):
        for key, item in value.items():
            _fate(node.keys.get(key, node.others), item, f"{path}.{key}" if path else key, unread)
    for key, inner in node.inner.items():
        if key in value:
            _walk(value[key], inner, f"{path}.{key}" if path else key, unread)


def _fate(fate: Fate | None, value: Any, path: str, unread: list[str]) -> None:
    if fate is None:
        raise RequestError(f"Unknown parameter: '{path}'.", path, code="unknown_parameter")
    if isinstance(fate, Unread):
        if fate.asks(value):
            unread.append(path)
    elif isinstance(fate, tuple):
        asks, why = fate
        if asks(value):
            raise RequestError(f"{path} is not supported: {why}", path, code="unsupported_parameter")


def _keys(*read: str, **fates: Fate) -> dict[str, Fate]:
    return {**dict.fromkeys(read, READ), **fates}


def _named(node: Node) -> Node:
    """`node` with every object in it naming a key it does not list (X-Hearth-Ignored-Fields) instead of
    refusing it: for a chat's messages, which clients send back as their SDK or framework holds them, with
    keys of their own (OpenAI's chat endpoint takes them too; its Responses and Anthropic refuse them)."""
    if isinstance(node, Obj):
        return replace(node, inner={k: _named(v) for k, v in node.inner.items()}, others=Unread())
    if isinstance(node, Each):
        return Each(_named(node.item))
    if isinstance(node, OneOf):
        return replace(node, kinds={k: cast(Obj, _named(v)) for k, v in node.kinds.items()})
    return node


# -- OpenAI chat and text completions ----------------------------------------
_CACHE_BREAKPOINT: dict[str, Fate] = {"prompt_cache_breakpoint": QUIET}  # the cache keeps every prefix
_JSON_SCHEMA = Obj(_keys("name", "schema", "strict", "any_whitespace", description=Unread()))
RESPONSE_FORMAT = OneOf({
    "text": Obj(_keys("type")), "json_object": Obj(_keys("type")),
    "json_schema": Obj(_keys("type", "json_schema"), {"json_schema": _JSON_SCHEMA})})

_TEXT = Obj(_keys("type", "text", **_CACHE_BREAKPOINT))
_IMAGE_URL = Obj(_keys("url", "detail"))
_NO_FILES = "there is no Files API here: send the image as a data: URL or an http(s) URL"
_CLIP = Obj(_keys("type", "video_url", "url", "data", **_CACHE_BREAKPOINT), {"video_url": Obj(_keys("url"))})
# Every part the shared reader takes (chat.text_of, serving/routes/audio.py), on chat and in Responses
# items alike: OpenAI's chat and Responses parts, and the aliases other servers take (`image`, `video`,
# `audio`, `audio_url`). The reader says where a part may go (media in user turns only, refusal parts in the
# assistant's); an input_file's file is never read, so the part is refused by the key that holds it.
_PART = OneOf({
    "text": _TEXT,
    "input_text": _TEXT,
    "output_text": Obj(_keys("type", "text", annotations=QUIET, logprobs=QUIET)),  # a reply's, sent back
    "refusal": Obj(_keys("type", "refusal")),
    "image_url": Obj(_keys("type", "image_url", **_CACHE_BREAKPOINT), {"image_url": _IMAGE_URL}),
    "input_image": Obj(_keys("type", "image_url", "detail", **_CACHE_BREAKPOINT, file_id=(is_set, _NO_FILES)),
                       {"image_url": _IMAGE_URL}),
    "image": Obj(_keys("type", "image_url", "url", "data", "image", "detail", **_CACHE_BREAKPOINT,
                       file_id=(is_set, _NO_FILES)), {"image_url": _IMAGE_URL}),
    "video_url": _CLIP,
    "video": _CLIP,
    "input_audio": Obj(_keys("type", "input_audio", **_CACHE_BREAKPOINT),
                       {"input_audio": Obj(_keys("data", "format"))}),
    "audio": Obj(_keys("type", "data", **_CACHE_BREAKPOINT)),
    "audio_url": Obj(_keys("type", "audio_url", **_CACHE_BREAKPOINT), {"audio_url": Obj(_keys("url"))}),
    "input_file": Obj(_keys("type", "filename", "detail", **_CACHE_BREAKPOINT, **dict.fromkeys(
        ("file_data", "file_id", "file_url"), (is_set, "files are not read here: send a file's text as input_text")))),
})
_CONTENT = {"content": Each(_PART)}
# `parsed` and `parsed_arguments`: what the openai SDK's parse() and stream() helpers add to a reply's message,
# sent back with it.
_CALL = OneOf({"function": Obj(_keys("id", "type", "function", index=QUIET),
                               {"function": Obj(_keys("name", "arguments", parsed_arguments=QUIET))})},
              default="function")
_ASSISTANT = Obj(_keys(
    "role", "content", "name", "tool_calls", "refusal", "reasoning_content", "reasoning",
    annotations=QUIET, parsed=QUIET,  # what a reply's message holds, sent back as it came
    audio=(is_set, "no audio output is generated, so there is no earlier audio reply to refer to"),
    function_call=(is_set, "the deprecated function_call field is not read: send tool_calls")),
    {**_CONTENT, "tool_calls": Each(_CALL)})
MESSAGE = _named(OneOf({
    "system": Obj(_keys("role", "content", "name"), _CONTENT),
    "developer": Obj(_keys("role", "content", "name"), _CONTENT),
    "user": Obj(_keys("role", "content", "name"), _CONTENT),
    "assistant": _ASSISTANT,
    "tool": Obj(_keys("role", "content", "tool_call_id", "name"), _CONTENT),
}, by="role"))
_FUNCTION = Obj(_keys("name", "description", "parameters", "strict"))
CHAT = Fields({
    "messages": Each(MESSAGE),
    "response_format": RESPONSE_FORMAT,
    "tools": Each(OneOf({"function": Obj(_keys("type", "function"), {"function": _FUNCTION})})),
    "tool_choice": OneOf({"function": Obj(_keys("type", "function"), {"function": Obj(_keys("name"))})}),
})
COMPLETIONS = Fields({"response_format": RESPONSE_FORMAT})

# -- OpenAI Responses ----------------------------------------------------------
_NOT_AUTO = other_than("auto")
# An output item sent back as it came (as Codex and the Agents SDK send them) carries its `id` and `status`:
# labels here. A call by a program, or in a namespace, is one of a tool Hearth does not have.
_ECHOED: dict[str, Fate] = {"id": QUIET, "status": QUIET}
_PHASE: dict[str, Fate] = {"phase": Unread()}  # commentary or final answer: OpenAI's models read it
_CALLER = (other_than({"type": "direct"}), "the model is the only caller here")
_NAMESPACE = (is_set, "tools have no namespaces here")
_REASONING_TEXT = Obj(_keys("type", "text"))
_ITEMS: dict[str, Node] = {
    "message": OneOf({
        **dict.fromkeys(("user", "system", "developer"), Obj(_keys(  # items of GET …/input_items have ids
            "type", "role", "content", **_ECHOED, **_PHASE), _CONTENT)),
        "assistant": Obj(_keys("type", "role", "content", **_ECHOED, **_PHASE), _CONTENT)}, by="role"),
    "function_call": Obj(_keys(
        "type", "call_id", "name", "arguments", "id", status=QUIET, caller=_CALLER, namespace=_NAMESPACE,
        **{"async": (is_set, "tools are called one turn at a time here")})),
    "function_call_output": Obj(_keys(
        "type", "call_id", "output", **_ECHOED, name=Unread(), caller=_CALLER, namespace=_NAMESPACE),
        {"output": Each(_PART)}),
    # Taken and left out of the prompt: earlier reasoning is not replayed.
    "reasoning": Obj(_keys("type", "summary", "content", "encrypted_content", **_ECHOED),
                     {"summary": Each(OneOf({"summary_text": _REASONING_TEXT})),
                      "content": Each(OneOf({"reasoning_text": _REASONING_TEXT}))}),
    "item_reference": Obj(_keys("type", "id")),  # replaced by the stored item it names (responses.py)
}
RESPONSES = Fields({
    "text": Obj(_keys("format", "verbosity"), {"format": OneOf({
        "text": Obj(_keys("type")), "json_object": Obj(_keys("type")),
        "json_schema": Obj(_keys("type", "name", "schema", "strict", description=Unread()))})}),
    "reasoning": Obj(_keys(
        "effort",
        # The reasoning comes back whole, as its summary, at any level asked for.
        summary=Unread(_NOT_AUTO), generate_summary=Unread(_NOT_AUTO),
        context=(_NOT_AUTO, "earlier turns' reasoning is never replayed into the prompt"),
        mode=(other_than("standard"), "one reasoning mode here"))),
    "tools": Each(OneOf({"function": Obj(_keys(
        "type", "name", "description", "parameters", "strict", output_schema=Unread(),
        defer_loading=(is_set, "every tool is in the prompt: there is no tool search here"),
        allowed_callers=(is_set, "the model is the only caller here"),
        **{"async": (is_set, "tools are called one turn at a time here")}))})),
    "tool_choice": OneOf({"function": Obj(_keys("type", "name"))}),
    "input": Each(OneOf(_ITEMS, default="message")),
})

# -- Anthropic Messages ----------------------------------------------------------
_CACHE_CONTROL: dict[str, Fate] = {"cache_control": QUIET}  # the cache keeps every prefix, no breakpoints needed
_TEXT_BLOCK = Obj(_keys("type", "text", **_CACHE_CONTROL, citations=Unread()))
_IMAGE_BLOCK = Obj(_keys("type", "source", **_CACHE_CONTROL,
                         transformations=(is_set, "images are given to the model as sent")),
                   {"source": OneOf({"base64": Obj(_keys("type", "media_type", "data")),
                                     "url": Obj(_keys("type", "url"))})})
_BLOCK = OneOf({
    "text": _TEXT_BLOCK,
    "image": _IMAGE_BLOCK,
    "tool_use": Obj(_keys("type", "id", "name", "input", **_CACHE_CONTROL, caller=Unread(),
                          toolset_name=Unread())),
    "tool_result": Obj(_keys("type", "tool_use_id", "content", "is_error", **_CACHE_CONTROL,
                             toolset_name=Unread()),
                       {"content": Each(OneOf({"text": _TEXT_BLOCK, "image": _IMAGE_BLOCK}))}),
    "thinking": Obj(_keys("type", "thinking", "signature")),  # earlier thinking is not replayed
    "redacted_thinking": Obj(_keys("type", "data")),
})
_TURN = Obj(_keys("role", "content"), {"content": Each(_BLOCK)})
_DISPLAY = (other_than("summarized"), "thinking comes back as the model wrote it")
_PARALLEL: dict[str, Fate] = {"disable_parallel_tool_use": READ}
MESSAGES = Fields({
    "messages": Each(OneOf({"user": _TURN, "assistant": _TURN, "system": _TURN}, by="role")),
    "system": Each(OneOf({"text": _TEXT_BLOCK})),
    "metadata": Obj({"user_id": QUIET}),
    "thinking": OneOf({"enabled": Obj(_keys("type", "budget_tokens", display=_DISPLAY)),
                       "adaptive": Obj(_keys("type", display=_DISPLAY)),
                       "disabled": Obj(_keys("type"))}),
    "tool_choice": OneOf({"auto": Obj(_keys("type", **_PARALLEL)), "any": Obj(_keys("type", **_PARALLEL)),
                          "tool": Obj(_keys("type", "name", **_PARALLEL)), "none": Obj(_keys("type"))}),
    "tools": Each(OneOf({"custom": Obj(_keys(
        "type", "name", "description", "input_schema", "strict", **_CACHE_CONTROL,
        input_examples=Unread(), eager_input_streaming=Unread(),
        defer_loading=(is_set, "every tool is in the prompt: there is no tool search here"),
        allowed_callers=(is_set, "the model is the only caller here")))}, default="custom")),
})

