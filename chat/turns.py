"""A chat turn as the OpenAI route would build it: one request body from
the session's settings, read by the same code as /v1/chat/completions."""
from __future__ import annotations

import json

from chat.models import ChatSession


def body(session: ChatSession, messages: list[dict], next_turn: dict, tools: list[dict] | None = None) -> dict:
    out: dict = {"messages": messages}
    if tools:
        out["tools"] = tools
    sampling = {**json.loads(session.sampling_json or "{}"), **next_turn}
    out.update({k: v for k, v in sampling.items() if v is not None})
    out["chat_template_kwargs"] = {"enable_thinking": bool(session.thinking)}
    if session.adapter:
        out["adapter"] = session.adapter
    return out


def prepare(session: ChatSession, messages: list[dict], next_turn: dict, model, tools: list[dict] | None = None):
    from inference.protocols.openai import chat_request
    from inference.runtime import runtime

    return chat_request(body(session, messages, next_turn, tools), model, runtime.defaults, runtime.grammar_enabled)
