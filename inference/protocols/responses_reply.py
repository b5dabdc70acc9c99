"""OpenAI Responses, the reply: the engine's events, split by the shared
OutputParser, become output items, the Response object and the Responses
stream event chain."""
from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator

from core import sse
from core.surfaces import RESPONSES
from inference.engine.types import EventStream, GenerationEvent
from inference.protocols.openai_reply import with_keepalive
from inference.protocols.output import Message, OutputParser, Piece, ToolDelta
from inference.protocols.responses import Turn, new_id
from inference.protocols.toolcalls import ToolCall


class Reply:
    def __init__(self, model_id: str, body: dict, turn: Turn, tokenizer):
        self.id = new_id("resp_")
        self.created = int(time.time())
        self.model_id, self.body, self.turn, self.tokenizer = model_id, body, turn, tokenizer
        self.new_item_ids()

    def new_item_ids(self) -> None:
        self.reasoning_id, self.message_id = new_id("rs_"), new_id("msg_")

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
        item = {"type": "reasoning", "id": self.reasoning_id, "status": status,
                "summary": [{"type": "summary_text", "text": text}]}
        if "reasoning.encrypted_content" in (self.body.get("include") or ()):
            # What a store=false client keeps and sends back: the text itself, not encrypted (nothing here is
            # secret from the machine that made it); earlier reasoning is not replayed into the prompt anyway.
            item["encrypted_content"] = base64.b64encode(text.encode()).decode()
        return item

    def message_item(self, text: str, status: str = "completed") -> dict:
        """`in_progress` (just added: no content yet), `completed`, or `incomplete` (cut by max_output_tokens)."""
        return {"type": "message", "id": self.message_id, "role": "assistant", "status": status,
                "content": [] if status == "in_progress" else [{"type": "output_text", "text": text,
                                                                 "annotations": []}]}

    @staticmethod
    def call_item(call: ToolCall, status: str | None = None) -> dict:
        """`in_progress` (just added: no arguments yet), `completed`, or `incomplete`: a call the reply
        was cut off in (output.py), its arguments as far as they were written."""
        status = status or ("incomplete" if call.cut else "completed")
        return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id,
                "name": call.name, "arguments": "" if status == "in_progress" else call.arguments, "status": status}

    def output(self, message: Message, status: str = "completed") -> list[dict]:
        """The output items in the order they were generated, as streamed; `status` is the last item's
        when it is text (`incomplete` when the reply was cut), a call's its own."""
        items: list[dict] = []
        for block in message.blocks:
            if isinstance(block, ToolCall):
                items.append(self.call_item(block))
                continue
            self.new_item_ids()  # every item its own id
            last = block is message.blocks[-1]
            if block.kind == "reasoning":
                items.append(self.reasoning_item(block.text, status if last else "completed"))
            else:
                items.append(self.message_item(block.text, status if last else "completed"))
        if not items:
            items.append(self.message_item("", status))  # as streamed: an empty reply is an empty message
        return items

    def usage(self, event: GenerationEvent, reasoning: str) -> dict:
        u = event.final_usage
        thought = len(self.tokenizer.encode(reasoning)) if reasoning else 0
        return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": min(thought, u.completion_tokens)},
                "total_tokens": u.total_tokens, "lane": u.lane, **({"fill": u.fill} if u.fill is not None else {})}

    def complete(self, message: Message, event: GenerationEvent) -> dict:
        status = status_of(event)
        return self.envelope(status, self.output(message, status), self.usage(event, message.reasoning),
                             "max_output_tokens" if status == "incomplete" else None)


def status_of(event: GenerationEvent) -> str:
    """`incomplete` for a reply its token limit cut short, calls or not, else `completed`."""
    return "incomplete" if event.finish_reason == "length" else "completed"


def chat_output(message: Message) -> list[dict]:
    """The reply as chat messages, for the next turn of a stored conversation; a call the reply was cut off in
    is not replayed (its arguments are not a JSON object a template can read, and nothing answered it)."""
    calls = [c for c in message.tool_calls if not c.cut]
    if not (message.content or calls):
        return [{"role": "assistant", "content": ""}]
    msg: dict = {"role": "assistant", "content": message.content}
    if calls:
        msg["tool_calls"] = [c.wire() for c in calls]
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
    completed (or incomplete). `await on_done(message, response)` stores the turn."""
    chain = _Chain(reply)
    yield (chain.emit("response.created", response=reply.envelope("in_progress", []))
           + chain.emit("response.in_progress", response=reply.envelope("in_progress", [])))
    message = Message()  # the whole reply, for the stored turn
    async for event in with_keepalive(events, output, keepalive):
        if event is None:
            yield sse.KEEP_ALIVE
            continue
        if event.error is not None:
            failed = RESPONSES.stream_error_event(event.error)
            yield chain.emit("error", **{k: v for k, v in failed.items() if k != "type"})
            return
        for item in output.ordered(event.text, event.finish_reason is not None, event.cut):
            if isinstance(item, ToolDelta):
                frames = chain.call(item, output.calls)
            else:
                frames = chain.piece(item, message) if item.text else []
            if frames:  # an event's frames in one write
                yield b"".join(frames)
        message.tool_calls = list(output.calls)
        if event.finish_reason is not None:
            frames = chain.open("content") if not chain.items and chain.open_kind is None else []  # one message
            yield b"".join(frames + chain.close(status_of(event)))
            final = reply.complete(message, event)
            final["output"] = chain.items
            await on_done(message, final)  # stored before the client reads that it is complete
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield chain.emit(kind, response=final)
            return
