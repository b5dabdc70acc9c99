"""OpenAI chat and text completions: wire JSON in, engine request out;
engine events in, wire JSON out. Nothing here touches MLX."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from inference.engine.loader import LoadedModel
from inference.engine.types import GenerationEvent, GenerationRequest, Usage
from inference.protocols import params
from inference.protocols.errors import RequestError, openai_error
from inference.runtime import ServerDefaults

ROLES = {"system", "developer", "user", "assistant", "tool"}


def _text_of(content, where: str) -> str:
    """Message content as one string: a string, null, or a list of parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content parts", where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "image", "input_image"):
            raise RequestError("model has no vision sidecar", f"{where}.content[{i}]")
        elif kind == "input_audio":
            raise RequestError("model has no audio tower", f"{where}.content[{i}]")
        else:
            raise RequestError(f"{where}.content[{i}] is not a text part", f"{where}.content[{i}]")
    return "".join(texts)


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages required", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(sorted(ROLES))}", f"{where}.role")
        msg = dict(m)
        msg["role"] = "system" if m["role"] == "developer" else m["role"]
        msg["content"] = _text_of(m.get("content"), where)
        out.append(msg)
    return out


def chat_prompt(model: LoadedModel, messages: list[dict], template_kwargs: dict) -> list[int]:
    tokenizer = model.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError("prompt build failed: this model has no chat template; use /v1/completions")
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **template_kwargs)
        return tokenizer.encode(text, add_special_tokens=False)
    except Exception as exc:  # jinja errors, raise_exception() in templates
        raise RequestError(f"prompt build failed: {exc}") from None


def _common(body: dict, model: LoadedModel, defaults: ServerDefaults) -> GenerationRequest:
    """Every field but the prompt, checked before the (costlier) prompt build."""
    params.single_choice(body)
    params.boolean(body, "stream")
    return GenerationRequest(
        prompt_tokens=[],
        max_tokens=params.max_tokens(body, defaults),
        sampling=params.sampling(body, defaults, model.generation_config),
        logit_bias=params.logit_bias(body, model.vocab_size),
        stop=params.stop_sequences(body),
    )


def chat_request(body: dict, model: LoadedModel, defaults: ServerDefaults) -> GenerationRequest:
    messages = chat_messages(body)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    request = _common(body, model, defaults)
    request.prompt_tokens = chat_prompt(model, messages, kwargs)
    return request


def completion_request(body: dict, model: LoadedModel, defaults: ServerDefaults) -> GenerationRequest:
    prompt = body.get("prompt")
    if prompt is None:
        raise RequestError("prompt required", "prompt")
    if not isinstance(prompt, str):
        raise RequestError("prompt must be a string (token arrays are not accepted)", "prompt")
    if not prompt:
        raise RequestError("prompt must not be empty", "prompt")
    request = _common(body, model, defaults)
    request.prompt_tokens = model.tokenizer.encode(prompt)
    return request


def usage_json(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "lane": "serial",
    }


class Reply:
    """Ids and timestamps shared by every chunk of one response."""

    def __init__(self, kind: str, model_id: str):
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        self.kind, self.model_id = kind, model_id
        self.id, self.created = prefix + uuid.uuid4().hex[:24], int(time.time())

    def _envelope(self, obj: str, choice: dict) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_id,
                "choices": [choice]}

    def complete(self, text: str, finish: str, usage: Usage) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish}
            out = self._envelope("chat.completion", choice)
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            out = self._envelope("text_completion", choice)
        out["usage"] = usage_json(usage)
        return out

    def chunk(self, text: str | None = None, finish: str | None = None, role: bool = False) -> dict:
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", choice)
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return self._envelope("text_completion", choice)


def sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


async def collect(events: AsyncIterator[GenerationEvent]) -> tuple[str, GenerationEvent]:
    """Drain a generation; returns the whole text and the final event."""
    parts = []
    async for event in events:
        parts.append(event.text)
        if event.error is not None or event.finish_reason is not None:
            return "".join(parts), event
    raise RuntimeError("generation ended without a final event")


async def stream(reply: Reply, events: AsyncIterator[GenerationEvent]) -> AsyncIterator[bytes]:
    """SSE frames: the role first (chat), text deltas, a final chunk with the
    finish reason and usage, then [DONE]. A failure mid-stream is sent as an
    error frame and the stream closes."""
    if reply.kind == "chat":
        yield sse(reply.chunk(role=True))
    async for event in events:
        if event.error is not None:
            yield sse(openai_error(event.error, "server_error"))
            return
        if event.text:
            yield sse(reply.chunk(event.text))
        if event.finish_reason is not None:
            final = reply.chunk(finish=event.finish_reason)
            final["usage"] = usage_json(event.usage)
            yield sse(final)
            yield sse("[DONE]")
            return
