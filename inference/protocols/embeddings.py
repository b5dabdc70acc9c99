"""OpenAI embeddings: checking the request, tokenizing its texts, the bound
on requests taken at once, and shaping the reply.

An embeddings request of 2,048 long strings holds its body, its tokens and,
in the engine, a turn between every two decode steps for minutes: at most
`MAX_TAKEN` are taken at once (tokenizing, waiting for their turns or
running them), and the next is refused at once with `QueueFull` (429
`queue_full` in OpenAI's shape, as a full generation queue is). No Django
here."""
from __future__ import annotations

import base64
import contextlib
import struct
import threading
from collections.abc import Iterator

from core.limits import Limits
from inference.engine.errors import QueueFull
from inference.protocols import unhonoured
from inference.protocols.chat import check_chars
from inference.protocols.errors import RequestError

MAX_INPUTS = 2048
# Requests taken at once. Each waiting one holds up to --max-body-bytes of body and its tokens, and each
# running one takes a turn of the engine thread between two decode steps: eight, the bound kept on large
# prompt builds (prompt_work.MAX_LARGE) and on calls waiting for the engine's exclusive use (solo.MAX_SOLO).
MAX_TAKEN = 8

_lock = threading.Lock()
_taken = 0


SHAPES = "a string, an array of strings, an array of token ids, or an array of token-id arrays"


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def inputs(body: dict, limits: Limits, vocab_size: int) -> list[str] | list[list[int]]:
    """The inputs as texts, or as token-id arrays (what langchain's OpenAIEmbeddings
    sends by default: the text already tokenized), one per embedding."""
    raw = body.get("input")
    if isinstance(raw, list) and raw and all(_is_id(t) for t in raw):
        return token_arrays([raw], "input", body, vocab_size)
    if isinstance(raw, list) and raw and all(isinstance(t, list) for t in raw):
        return token_arrays(raw, "input[{i}]", body, vocab_size)
    return texts(body, limits)


def token_arrays(arrays: list[list], where: str, body: dict, vocab_size: int) -> list[list[int]]:
    if len(arrays) > MAX_INPUTS:
        raise RequestError(f"input may hold at most {MAX_INPUTS} token arrays", "input")
    if body.get("instruction") is not None:
        raise RequestError("instruction applies to text inputs; send text, or put the instruction's tokens in "
                           "the arrays", "instruction")
    for i, ids in enumerate(arrays):
        if not ids:
            raise RequestError("a token array must not be empty", where.format(i=i))
        bad = [t for t in ids if not _is_id(t) or not 0 <= t < vocab_size][:1]
        if bad:
            raise RequestError(f"token ids are integers from 0 to {vocab_size - 1} (this model's vocabulary); "
                               f"got {bad[0]!r}", where.format(i=i))
    return arrays


def texts(body: dict, limits: Limits) -> list[str]:
    raw = body.get("input")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise RequestError(f"input must be {SHAPES}", "input")
    if len(items) > MAX_INPUTS:
        raise RequestError(f"input may hold at most {MAX_INPUTS} strings", "input")
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise RequestError(f"input must be {SHAPES}, not a mix", f"input[{i}]" if isinstance(raw, list)
                               else "input")
        if not text:
            raise RequestError("input strings must not be empty", f"input[{i}]" if isinstance(raw, list) else "input")
    instruction = body.get("instruction")
    if instruction is not None:
        if not isinstance(instruction, str):
            raise RequestError("instruction must be a string", "instruction")
        items = [f"Instruct: {instruction}\nQuery:{text}" for text in items]
    check_chars(sum(len(text) for text in items), "input", limits, "input")
    return items


@contextlib.contextmanager
def taken() -> Iterator[None]:
    """A place for one request while the block runs; `QueueFull` while `MAX_TAKEN` are taken."""
    global _taken
    with _lock:
        if _taken >= MAX_TAKEN:
            raise QueueFull(f"{MAX_TAKEN} embeddings requests are already being served; retry later")
        _taken += 1
    try:
        yield
    finally:
        with _lock:
            _taken -= 1


def tokenize(tokenizer, items: list[str] | list[list[int]]) -> list[list[int]]:
    """The token ids of each input (token arrays as they came); run off the event loop."""
    return [t if isinstance(t, list) else tokenizer.encode(t) for t in items]


def encoding(body: dict) -> str:
    unhonoured.refuse(body, unhonoured.EMBEDDINGS)
    value = body.get("encoding_format", "float")
    if value not in ("float", "base64"):
        raise RequestError("encoding_format must be 'float' or 'base64'", "encoding_format")
    return value


def reply(vectors: list[list[float]], model_id: str, prompt_tokens: int, fmt: str) -> dict:
    def encode(v: list[float]):
        if fmt == "float":
            return v
        return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()

    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
