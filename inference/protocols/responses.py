"""OpenAI Responses, the request: input items (with a stored conversation
spliced back in for `previous_response_id`, and each `item_reference`
replaced by the stored item it names) become a chat turn on the shared
path. The reply is rendered by `responses_reply.py`."""
from __future__ import annotations

import json
import uuid

from core.limits import DEFAULT
from inference.protocols import chat, unhonoured
from inference.protocols.errors import RequestError
from inference.protocols.params import SAMPLING, boolean, integer
from inference.protocols.response_store import AnyResponseStore, Stored

EXTRAS = (*(f for f in SAMPLING if f not in ("temperature", "top_p", "top_k")), "logit_bias",
          "session_id", "prompt_cache_key", "chat_template_kwargs", "guided_grammar", "guided_regex",
          "guided_choice", "stop", "adapter", "parallel_tool_calls", "hlg", "speculative")


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


# -- request ---------------------------------------------------------------
ITEM_ID_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


def _bounded(raw, most: int) -> None:
    """Refuse an `input` list of more than `most` items (--max-messages), before anything reads the store."""
    if isinstance(raw, list) and len(raw) > most:
        raise RequestError(f"input has {len(raw)} items; this server takes at most {most} (--max-messages)",
                           f"input[{most}]", code="too_many_messages")


def _resolved(raw, store: AnyResponseStore, holder: str):
    """`input` with each `item_reference` replaced by the stored item of its
    id (an output or input item of a response this key stored), which is
    then read as an item of its own type is. The store is read once for the
    index and once per response named (this runs on a worker thread: a
    folder or Redis store blocks); `Turn` has bounded `input` first (`_bounded`)."""
    if not isinstance(raw, list):
        return raw
    refs = {}
    for i, item in enumerate(raw):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            if not isinstance(item.get("id"), str) or not item["id"]:
                raise RequestError(f"input[{i}].id required: the id of a stored item", f"input[{i}].id")
            refs[i] = item["id"]
    where = store.where(list(dict.fromkeys(refs.values())), holder) if refs else {}
    turns: dict[str, Stored | None] = {}  # each response read once, however many of its items are named
    out = []
    for i, item in enumerate(raw):
        if i in refs:
            response_id = where.get(refs[i])
            if response_id is not None and response_id not in turns:
                turns[response_id] = store.get(response_id, holder)
            stored = turns.get(response_id) if response_id is not None else None
            found = stored.item(refs[i]) if stored is not None else None
            if found is None:
                # OpenAI answers 404 here too ("Item with id … not found"), with `param: input`.
                raise RequestError(f"Item with id '{refs[i]}' not found: it was never stored (store: false), "
                                   "its response expired or was deleted, or it is another key's", f"input[{i}].id",
                                   status=404, code="item_not_found")
            item = found
        out.append(item)
    return out


def stored_items(raw) -> list[dict]:
    """The input items as GET …/input_items lists them and `item_reference`
    finds them: each with an id (its own, or a new one), a message's text
    content as a part, a message `completed`."""
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    items = []
    for item in raw:
        item = {"type": "message", **item}
        kind = item["type"]
        if not isinstance(item.get("id"), str) or not item["id"]:
            item["id"] = new_id(ITEM_ID_PREFIXES.get(kind, "item_"))
        if kind == "message":
            if isinstance(item.get("content"), str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": item["content"], **(
                    {"annotations": []} if part == "output_text" else {})}]
            item.setdefault("status", "completed")
        items.append(item)
    return items


def _items(raw) -> tuple[list[dict], list[str]]:
    """Chat messages from `input`, and the system/developer texts found in it."""
    if isinstance(raw, str):
        if not raw:
            raise RequestError("input must not be empty", "input")
        return [{"role": "user", "content": raw}], []
    if not isinstance(raw, list) or not raw:
        raise RequestError("input required: a string or a list of items", "input")
    out: list[dict] = []
    system: list[str] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(f"{where}.role must be user, assistant, system or developer", f"{where}.role")
            if role in ("system", "developer"):
                _no_media(item.get("content"), where, f"a {role} item's content joins the instructions, which "
                                                      "are text: send images in a user item")
                system.append(chat.text_of(item.get("content"), where))
            else:
                if role == "assistant":
                    _no_media(item.get("content"), where, "images are only allowed in user items (and in a "
                                                          "function_call_output), and this is an assistant item")
                out.append({"role": role, "content": chat.keep_media(item.get("content"), where,
                                                                     refusals=role == "assistant")})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str):
                raise RequestError(f"{where}.name required", f"{where}.name")
            call = {"id": str(item.get("call_id") or item.get("id") or new_id("call_")), "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            elif out and out[-1]["role"] == "assistant":
                out[-1]["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not item["call_id"]:
                raise RequestError(f"{where}.call_id required: the call_id of the function_call this answers",
                                   f"{where}.call_id")
            output = item.get("output")
            # A list output holds input_text and input_image parts (a screenshot a tool took).
            content = output if isinstance(output, str) else chat.keep_media(output, where, "output") \
                if isinstance(output, list) else json.dumps(output)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        elif kind == "reasoning":
            continue  # earlier reasoning is not replayed
        else:
            raise RequestError(f"{where}: unsupported input item type {kind!r}", f"{where}.type")
    return out, system


def _no_media(content, where: str, why: str) -> None:
    """An image or video part of an item that holds only text (a system,
    developer or assistant item) refused, naming the part."""
    for i, part in enumerate(content if isinstance(content, list) else []):
        if isinstance(part, dict) and part.get("type") in chat.IMAGE_PARTS + chat.VIDEO_PARTS:
            raise RequestError(why, f"{where}.content[{i}]")


def _tools(raw) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RequestError("tools must be a list", "tools")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue  # built-in tools (web_search, file_search, mcp, computer_use) are dropped
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise RequestError(f"tools[{i}].name required", f"tools[{i}].name")
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise RequestError(f"tools[{i}].parameters must be a JSON schema object", f"tools[{i}].parameters")
        function = {"name": tool["name"], "description": tool.get("description") or "",
                    "parameters": tool.get("parameters") or {}}
        if isinstance(tool.get("strict"), bool):  # a strict tool's arguments are enforced (tool_choice.py)
            function["strict"] = tool["strict"]
        tools.append({"type": "function", "function": function})
    return tools or None


def _tool_choice(raw):
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("name"), str):
        return {"type": "function", "function": {"name": raw["name"]}}
    if isinstance(raw, dict) and isinstance(raw.get("type"), str) and raw["type"] != "function":
        # a built-in tool (dropped: it never runs here), a custom tool (not built), a subset of the tools
        raise RequestError(f"tool_choice {{\"type\": {json.dumps(raw['type'])}}} is not supported: it asks for a tool "
                           "this server does not run, or a subset of the tools; send 'auto', 'none', 'required' or "
                           "{\"type\": \"function\", \"name\": …}", "tool_choice", code="unsupported_parameter")
    raise RequestError("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": …}",
                       "tool_choice")


def _text_format(text) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise RequestError("text must be an object, e.g. {\"format\": {\"type\": \"json_schema\", …}}", "text")
    if text.get("verbosity") not in (None, *chat.VERBOSITY, "medium"):
        raise RequestError("text.verbosity must be low, medium or high", "text.verbosity")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict):
        raise RequestError("text.format must be an object", "text.format")
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "response"),
                                                       "schema": fmt.get("schema"), "strict": fmt.get("strict")}}
    raise RequestError("text.format.type must be text, json_object or json_schema", "text.format.type")


class Turn:
    """The chat turn a Responses request stands for: built on a worker
    thread, as it reads the store (a file, Redis); `most` bounds the input
    items (--max-messages)."""

    def __init__(self, body: dict, store: AnyResponseStore, holder: str = "", most: int = DEFAULT.max_messages):
        unhonoured.refuse(body, unhonoured.RESPONSES)
        if body.get("stream_options") is not None and not boolean(body, "stream"):  # as on OpenAI, as on chat
            raise RequestError("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                               "stream_options")
        _bounded(body.get("input"), most)  # first: a refused input reads nothing from the store
        previous_id = body.get("previous_response_id")
        self.previous = None
        if previous_id is not None:
            if not isinstance(previous_id, str):
                raise RequestError("previous_response_id must be a string", "previous_response_id")
            self.previous = store.get(previous_id, holder)  # another key's is not there
            if self.previous is None:
                raise RequestError(f"Response with id '{previous_id}' not found (unknown or expired)",
                                   "previous_response_id", status=404, code="response_not_found")
        raw = _resolved(body.get("input"), store, holder)
        new, system = _items(raw)
        self.input_items = stored_items(raw)  # read: every item is an object of a type the reader takes
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise RequestError("instructions must be a string", "instructions")
        if instructions is None and self.previous is not None:
            instructions = self.previous.instructions  # carried forward when omitted
        self.instructions = instructions
        history = []
        if self.previous is not None:  # earlier system/developer items stay; the system turn is rebuilt
            history = [m for m in self.previous.messages if m["role"] != "system"] + self.previous.output
            system = [*self.previous.system, *system]
        self.system = system
        texts = [t for t in [instructions, *system] if t]
        self.messages = ([{"role": "system", "content": "\n\n".join(texts)}] if texts else []) + history + new

    def chat_body(self, body: dict) -> dict:
        chat: dict = {"messages": self.messages, "stream": body.get("stream", False)}
        # Checked here, under the name the client sent; the chat body calls it max_tokens.
        limit = integer(body, "max_output_tokens" if "max_output_tokens" in body else "max_tokens", 1)
        if limit is not None:
            chat["max_tokens"] = limit
        for name in ("temperature", "top_p", "top_k", *EXTRAS):
            if body.get(name) is not None:
                chat[name] = body[name]
        tools = _tools(body.get("tools"))
        choice = _tool_choice(body.get("tool_choice"))
        if tools:
            chat["tools"] = tools
        if choice is not None:  # one that asks for a call needs function tools (chat.tools_for)
            chat["tool_choice"] = choice
        fmt = _text_format(body.get("text"))
        if fmt is not None:
            chat["response_format"] = fmt
        if isinstance(body.get("text"), dict) and body["text"].get("verbosity") is not None:
            chat["verbosity"] = body["text"]["verbosity"]  # a line in the system turn (chat.with_verbosity)
        reasoning = body.get("reasoning")
        if reasoning is not None and not isinstance(reasoning, dict):
            raise RequestError("reasoning must be an object, e.g. {\"effort\": \"low\"}", "reasoning")
        effort = (reasoning or {}).get("effort")
        if effort is not None:
            chat["reasoning_effort"] = effort
        return chat
