"""OpenAI Responses: input items (with a stored conversation spliced back
in for `previous_response_id`) become a chat turn on the shared path; the
engine's events, split by the shared OutputParser, become output items and
the Responses stream event chain."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from core import sse
from core.surfaces import RESPONSES
from inference.engine.types import EventStream, GenerationEvent
from inference.protocols import chat
from inference.protocols.errors import RequestError
from inference.protocols.openai import Message, with_keepalive
from inference.protocols.output import OutputParser, Piece, ToolDelta
from inference.protocols.params import SAMPLING, integer
from inference.protocols.response_store import AnyResponseStore
from inference.protocols.toolcalls import ToolCall

EXTRAS = (*(f for f in SAMPLING if f not in ("temperature", "top_p", "top_k")), "logit_bias",
          "session_id", "prompt_cache_key", "chat_template_kwargs", "guided_grammar", "guided_regex",
          "guided_choice", "stop", "adapter", "parallel_tool_calls", "hlg")


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


# -- request ---------------------------------------------------------------
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
                system.append(chat.text_of(item.get("content"), where))
            else:
                out.append({"role": role, "content": chat.keep_media(item.get("content"), where)})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str):
                raise RequestError(f"{where}.name required", f"{where}.name")
            call = {"id": str(item.get("call_id") or item.get("id") or _new_id("call_")), "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            elif out and out[-1]["role"] == "assistant":
                out[-1]["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else chat.text_of(output, where) if isinstance(output, list) \
                else json.dumps(output)
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text})
        elif kind == "reasoning":
            continue  # earlier reasoning is not replayed
        else:
            raise RequestError(f"{where}: unsupported input item type {kind!r}", f"{where}.type")
    return out, system


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
    if isinstance(raw, dict):
        return "auto"  # a built-in tool choice: its tools were dropped
    raise RequestError("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": …}",
                       "tool_choice")


def _text_format(text) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise RequestError("text must be an object, e.g. {\"format\": {\"type\": \"json_schema\", …}}", "text")
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
    """The chat turn a Responses request stands for."""

    def __init__(self, body: dict, store: AnyResponseStore, holder: str = ""):
        previous_id = body.get("previous_response_id")
        self.previous = None
        if previous_id is not None:
            if not isinstance(previous_id, str):
                raise RequestError("previous_response_id must be a string", "previous_response_id")
            self.previous = store.get(previous_id, holder)  # another key's is not there
            if self.previous is None:
                raise RequestError(f"Response with id '{previous_id}' not found (unknown or expired)",
                                   "previous_response_id", status=404, code="response_not_found")
        new, system = _items(body.get("input"))
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
            if choice is not None:
                chat["tool_choice"] = choice
        fmt = _text_format(body.get("text"))
        if fmt is not None:
            chat["response_format"] = fmt
        reasoning = body.get("reasoning")
        if reasoning is not None and not isinstance(reasoning, dict):
            raise RequestError("reasoning must be an object, e.g. {\"effort\": \"low\"}", "reasoning")
        effort = (reasoning or {}).get("effort")
        if effort is not None:
            chat["reasoning_effort"] = effort
        return chat


# -- response --------------------------------------------------------------
class Reply:
    def __init__(self, model_id: str, body: dict, turn: Turn, tokenizer):
        self.id = _new_id("resp_")
        self.created = int(time.time())
        self.model_id, self.body, self.turn, self.tokenizer = model_id, body, turn, tokenizer
        self.new_item_ids()

    def new_item_ids(self) -> None:
        self.reasoning_id, self.message_id = _new_id("rs_"), _new_id("msg_")

    def envelope(self, status: str, output: list[dict], usage: dict | None = None,
                 incomplete: str | None = None) -> dict:
        b = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model_id, "output": output, "usage": usage, "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": self.turn.instructions, "previous_response_id": b.get("previous_response_id"),
            "max_output_tokens": b.get("max_output_tokens"), "temperature": b.get("temperature"),
            "top_p": b.get("top_p"), "tools": b.get("tools") or [], "tool_choice": b.get("tool_choice") or "auto",
            "parallel_tool_calls": b.get("parallel_tool_calls", True), "text": b.get("text") or {"format": {
                "type": "text"}}, "metadata": b.get("metadata") or {}, "store": b.get("store", True),
        }

    def reasoning_item(self, text: str, status: str = "completed") -> dict:
        return {"type": "reasoning", "id": self.reasoning_id, "status": status,
                "summary": [{"type": "summary_text", "text": text}]}

    def message_item(self, text: str, status: str = "completed") -> dict:
        """`in_progress` (just added: no content yet), `completed`, or `incomplete` (cut by max_output_tokens)."""
        return {"type": "message", "id": self.message_id, "role": "assistant", "status": status,
                "content": [] if status == "in_progress" else [{"type": "output_text", "text": text,
                                                                 "annotations": []}]}

    @staticmethod
    def call_item(call, status: str = "completed") -> dict:
        return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id,
                "name": call.name, "arguments": call.arguments if status == "completed" else "", "status": status}

    def output(self, message: Message, status: str = "completed") -> list[dict]:
        """The output items; `status` is the last text item's (`incomplete` when the reply was cut)."""
        has_message = bool(message.content) or not (message.tool_calls or message.reasoning)  # as streamed
        items = [self.reasoning_item(message.reasoning, "completed" if has_message else status)] \
            if message.reasoning else []
        if has_message:
            items.append(self.message_item(message.content, status))
        return items + [self.call_item(c) for c in message.tool_calls]

    def usage(self, event: GenerationEvent, reasoning: str) -> dict:
        u = event.final_usage
        thought = len(self.tokenizer.encode(reasoning)) if reasoning else 0
        return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": min(thought, u.completion_tokens)},
                "total_tokens": u.total_tokens, "lane": u.lane}

    def complete(self, message: Message, event: GenerationEvent) -> dict:
        status = cut(event, message)
        return self.envelope(status, self.output(message, status), self.usage(event, message.reasoning),
                             "max_output_tokens" if status == "incomplete" else None)


def cut(event: GenerationEvent, message: Message) -> str:
    """`incomplete` for a reply its token limit cut short, else `completed`."""
    return "incomplete" if event.finish_reason == "length" and not message.tool_calls else "completed"


def chat_output(message: Message) -> list[dict]:
    """The reply as chat messages, for the next turn of a stored conversation."""
    if not (message.content or message.tool_calls):
        return [{"role": "assistant", "content": ""}]
    msg: dict = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        msg["tool_calls"] = [c.wire() for c in message.tool_calls]
    return [msg]


class _Chain:
    """One Responses stream: the `sequence_number`ed event chain, the output
    items it has closed, and the item open now (reasoning or message text)."""

    def __init__(self, reply: Reply):
        self.reply = reply
        self.seq = 0
        self.items: list[dict] = []
        self.open_kind: str | None = None  # "reasoning" | "content" while an item is open
        self.text = ""  # the open item's text
        self.calling: ToolCall | None = None  # the function call being streamed

    def emit(self, kind: str, **fields) -> bytes:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse.frame(event, kind)

    def open(self, kind: str) -> list[bytes]:
        reply, index = self.reply, len(self.items)
        self.open_kind, self.text = kind, ""
        reply.new_item_ids()  # every item its own id
        if kind == "reasoning":
            item = {"type": "reasoning", "id": reply.reasoning_id, "summary": []}
            return [self.emit("response.output_item.added", output_index=index, item=item),
                    self.emit("response.reasoning_summary_part.added", item_id=reply.reasoning_id,
                              output_index=index, summary_index=0, part={"type": "summary_text", "text": ""})]
        return [self.emit("response.output_item.added", output_index=index,
                          item=reply.message_item("", "in_progress")),
                self.emit("response.content_part.added", item_id=reply.message_id, output_index=index,
                          content_index=0, part={"type": "output_text", "text": "", "annotations": []})]

    def close(self, status: str = "completed") -> list[bytes]:
        """Close the open item; `status` is its own (`incomplete` for the last one of a cut reply)."""
        reply, index, text, frames = self.reply, len(self.items), self.text, []
        if self.open_kind == "reasoning":
            frames.append(self.emit("response.reasoning_summary_text.done", item_id=reply.reasoning_id,
                                    output_index=index, summary_index=0, text=text))
            frames.append(self.emit("response.reasoning_summary_part.done", item_id=reply.reasoning_id,
                                    output_index=index, summary_index=0, part={"type": "summary_text", "text": text}))
            self.items.append(reply.reasoning_item(text, status))
        elif self.open_kind == "content":
            frames.append(self.emit("response.output_text.done", item_id=reply.message_id, output_index=index,
                                    content_index=0, text=text))
            frames.append(self.emit("response.content_part.done", item_id=reply.message_id, output_index=index,
                                    content_index=0, part={"type": "output_text", "text": text, "annotations": []}))
            self.items.append(reply.message_item(text, status))
        if self.open_kind is not None:
            frames.append(self.emit("response.output_item.done", output_index=index, item=self.items[-1]))
        self.open_kind = None
        return frames

    def piece(self, piece: Piece, message: Message) -> list[bytes]:
        frames = [] if self.open_kind == piece.kind else self.close() + self.open(piece.kind)
        index = len(self.items)
        self.text += piece.text
        if piece.kind == "reasoning":
            message.reasoning += piece.text
            frames.append(self.emit("response.reasoning_summary_text.delta", item_id=self.reply.reasoning_id,
                                    output_index=index, summary_index=0, delta=piece.text))
        else:
            message.content += piece.text
            frames.append(self.emit("response.output_text.delta", item_id=self.reply.message_id, output_index=index,
                                    content_index=0, delta=piece.text))
        return frames

    def call(self, delta: ToolDelta, calls: list) -> list[bytes]:
        """A function_call item: added on the call's first delta, its
        arguments as they come, done (with them whole) on its last."""
        frames: list[bytes] = []
        if delta.name is not None:
            frames, self.calling = self.close(), ToolCall(delta.name, "", delta.id)
            frames.append(self.emit("response.output_item.added", output_index=len(self.items),
                                    item=self.reply.call_item(self.calling, "in_progress")))
        calling, index = self.calling, len(self.items)
        assert calling is not None
        item_id = "fc_" + calling.id.removeprefix("call_")
        if delta.arguments:
            frames.append(self.emit("response.function_call_arguments.delta", item_id=item_id, output_index=index,
                                    delta=delta.arguments))
            self.calling = calling = ToolCall(calling.name, calling.arguments + delta.arguments, calling.id)
        if delta.done:
            whole = calls[delta.index] if delta.index < len(calls) else calling  # as the parser settled it
            frames.append(self.emit("response.function_call_arguments.done", item_id=item_id, output_index=index,
                                    arguments=whole.arguments))
            item = self.reply.call_item(whole)
            self.items.append(item)
            self.calling = None
            frames.append(self.emit("response.output_item.done", output_index=index, item=item))
        return frames


async def stream(reply: Reply, events: EventStream, output: OutputParser, keepalive: float,
                 on_done) -> AsyncIterator[bytes]:
    """The Responses event chain: created, in_progress, then per output item
    added → (content part, text deltas | argument deltas) → done, and
    completed (or incomplete). `on_done(message, response)` stores the turn."""
    chain = _Chain(reply)
    yield chain.emit("response.created", response=reply.envelope("in_progress", []))
    yield chain.emit("response.in_progress", response=reply.envelope("in_progress", []))
    message = Message()  # the whole reply, for the stored turn
    async for event in with_keepalive(events, output, keepalive):
        if event is None:
            yield sse.KEEP_ALIVE
            continue
        if event.error is not None:
            failed = RESPONSES.stream_error_event(event.error)
            yield chain.emit("error", **{k: v for k, v in failed.items() if k != "type"})
            return
        pieces = output.feed(event.text)
        if event.finish_reason is not None:
            pieces += output.finish()
        for piece in pieces:
            for frame in chain.piece(piece, message) if piece.text else []:
                yield frame
        for delta in output.take_deltas():
            for frame in chain.call(delta, output.calls):
                yield frame
        message.tool_calls = list(output.calls)
        if event.finish_reason is not None:
            frames = chain.open("content") if not chain.items and chain.open_kind is None else []  # one message
            for frame in frames + chain.close(cut(event, message)):
                yield frame
            final = reply.complete(message, event)
            final["output"] = chain.items
            on_done(message, final)
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield chain.emit(kind, response=final)
            return
