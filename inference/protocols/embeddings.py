"""OpenAI embeddings: checking the request and shaping the reply."""
from __future__ import annotations

import base64
import struct

from core.limits import Limits
from inference.protocols.chat import check_chars
from inference.protocols.errors import RequestError

MAX_INPUTS = 2048


def texts(body: dict, limits: Limits) -> list[str]:
    raw = body.get("input")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise RequestError("input must be a string or a non-empty array of strings", "input")
    if len(items) > MAX_INPUTS:
        raise RequestError(f"input may hold at most {MAX_INPUTS} strings", "input")
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise RequestError("input must be a string or an array of strings (token arrays are not accepted)",
                               f"input[{i}]" if isinstance(raw, list) else "input")
        if not text:
            raise RequestError("input strings must not be empty", f"input[{i}]" if isinstance(raw, list) else "input")
    instruction = body.get("instruction")
    if instruction is not None:
        if not isinstance(instruction, str):
            raise RequestError("instruction must be a string", "instruction")
        items = [f"Instruct: {instruction}\nQuery:{text}" for text in items]
    check_chars(sum(len(text) for text in items), "input", limits, "input")
    return items


def chunks(tokens: list[list[int]], budget: int) -> list[list[list[int]]]:
    """Consecutive inputs grouped so each group holds about `budget` tokens (one input at least)."""
    out: list[list[list[int]]] = []
    size = 0
    for t in tokens:
        if not out or size + len(t) > budget:
            out.append([])
            size = 0
        out[-1].append(t)
        size += len(t)
    return out


def encoding(body: dict) -> str:
    value = body.get("encoding_format", "float")
    if value not in ("float", "base64"):
        raise RequestError("encoding_format must be 'float' or 'base64'", "encoding_format")
    if body.get("dimensions") is not None:
        raise RequestError("dimensions is not supported: the model's embedding size is fixed", "dimensions")
    return value


def reply(vectors: list[list[float]], model_id: str, prompt_tokens: int, fmt: str) -> dict:
    def encode(v: list[float]):
        if fmt == "float":
            return v
        return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()

    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
