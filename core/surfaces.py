"""One `Surface` per protocol Hearth speaks, owning its edge: the error
body, the event that ends a stream with an error, the server-sent events
response and its headers, and the ninja `Router` its routes hang on.

- `OPENAI`: OpenAI's chat, completions, embeddings, audio and everything
  else under `/v1`, `{"error": {"message", "type", "param", "code"}}`;
- `ANTHROPIC`: Anthropic's Messages (`/v1/messages*`),
  `{"type": "error", "error": {"type", "message"}}`;
- `RESPONSES`: OpenAI's Responses (`/v1/responses*`): OpenAI's error body,
  its own stream `error` event;
- `API`: the dashboard's `/api`, `{"ok": false, "error": message}`;
- `SOCKET`: the chat's WebSocket (`/ws/chat`), `{"type": "error", "message"}` frames.

A route belongs to its surface by the router it hangs on (`surface.router()`):
that router marks each request it runs (`request.surface`), and the API's
error handlers answer in that surface's shape. Only the layers that answer
before any route is found (the connection guards, the ASGI wrapper, the
middleware, the 404 handler, the router-mode proxy) look a surface up by
path, with `for_path`, from the prefixes the surfaces declare here.

The bodies and frames need no Django; the responses and routers import
Django and django-ninja when asked for (as `core/api.py` and `core/db.py`
do). No imports of the project's apps."""
from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from core import sse

DRAINING_HEADER = "x-hearth-draining"  # on the 503 a draining server answers (another web node retries here)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy may buffer a stream


class Surface:
    """OpenAI's shape; the other surfaces override what differs."""

    name = "openai"
    prefixes: tuple[str, ...] = ()  # paths this surface answers under, for `for_path` only

    # -- bodies --------------------------------------------------------------
    def error(self, status: int, message: str, code: str | None = None, kind: str | None = None,
              param: str | None = None) -> dict:
        """The error body. `kind` (OpenAI's `type`) defaults by status."""
        kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}

    def error_bytes(self, status: int, message: str, code: str | None = None, kind: str | None = None) -> bytes:
        return json.dumps(self.error(status, message, code, kind)).encode()

    stream_event: str | None = None  # the `event:` name of a stream's error event, if the protocol names it

    def stream_error_event(self, message: str, kind: str | None = None) -> dict:
        """The event that ends one of this surface's streams with an error (a server error unless `kind`)."""
        return self.error(500, message, kind or "server_error", kind or "server_error")

    def stream_error(self, message: str, kind: str | None = None) -> bytes:
        """`stream_error_event` as a server-sent event."""
        return sse.frame(self.stream_error_event(message, kind), self.stream_event)

    numbered = False  # whether each event of this surface's streams carries the next `sequence_number`

    def follows(self, event: bytes, last: int | None) -> bytes:
        """`event` (one server-sent event) as it goes on a stream whose last
        event was numbered `last` (None: none was): a surface that numbers its
        events gives it the next number (`numbered`); the others send it as it is."""
        return event

    def ends_in_error(self, tail: bytes) -> bool:
        """Whether a stream of this surface whose last bytes are `tail` ended with
        its error event (every protocol's stream ends there when generation fails)."""
        last = tail.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        if self.stream_event:
            return last.startswith(f"event: {self.stream_event}\n".encode())
        return last.startswith(b'data: {"error"')

    # -- Django responses ------------------------------------------------------
    def response(self, status: int, message: str, code: str | None = None, kind: str | None = None,
                 param: str | None = None, headers: dict | None = None):
        """The error as a JsonResponse with its status."""
        from django.http import JsonResponse

        return JsonResponse(self.error(status, message, code, kind, param), status=status, headers=headers)

    def sse(self, frames: AsyncIterator[bytes] | Iterator[bytes] | bytes, headers: dict | None = None):
        """A server-sent events response: `frames` as they come (or a finished
        body's bytes), with the headers every stream carries."""
        from django.http import HttpResponse, StreamingHttpResponse

        headers = {**SSE_HEADERS, **(headers or {})}
        if isinstance(frames, bytes):
            return HttpResponse(frames, content_type="text/event-stream", headers=headers)
        return StreamingHttpResponse(frames, content_type="text/event-stream", headers=headers)

    # -- routes ----------------------------------------------------------------
    def router(self, **kwargs):
        """A ninja Router whose routes answer on this surface: each request it
        runs carries `request.surface`, which the API's error handlers read."""
        from ninja import Router

        router = Router(**kwargs)
        router.add_decorator(self._marking, mode="view")
        return router

    def _marking(self, run):
        surface = self
        if inspect.iscoroutinefunction(run):
            @functools.wraps(run)
            async def marked_async(request, *args, **kwargs):
                request.surface = surface
                return await run(request, *args, **kwargs)
            return marked_async

        @functools.wraps(run)
        def marked(request, *args, **kwargs):
            request.surface = surface
            return run(request, *args, **kwargs)
        return marked

    def __repr__(self) -> str:
        return f"<Surface {self.name}>"


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                   429: "rate_limit_error", 503: "overloaded_error"}


class AnthropicSurface(Surface):
    name = "anthropic"
    prefixes = ("/v1/messages",)

    def error(self, status, message, code=None, kind=None, param=None) -> dict:
        """Anthropic's body: its `type` follows the status; `code` and `param` are OpenAI's and left out."""
        return {"type": "error", "error": {"type": self.error_type(status), "message": message}}

    @staticmethod
    def error_type(status: int) -> str:
        return ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")

    stream_event = "error"

    def stream_error_event(self, message: str, kind: str | None = None) -> dict:
        return {"type": "error", "error": {"type": kind or "api_error", "message": message}}


class ResponsesSurface(Surface):
    name = "responses"
    prefixes = ("/v1/responses",)

    stream_event = "error"

    def stream_error_event(self, message: str, kind: str | None = None) -> dict:
        return {"type": "error", "code": kind or "server_error", "message": message, "param": None}

    numbered = True

    def follows(self, event: bytes, last: int | None) -> bytes:
        head, sep, data = event.partition(b"data: ")
        try:
            body = json.loads(data) if sep else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return event
        body.pop("sequence_number", None)
        body = {"type": body.pop("type", None), "sequence_number": 0 if last is None else last + 1, **body}
        return head + sep + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


class ApiSurface(Surface):
    name = "api"
    prefixes = ("/api/",)

    def error(self, status, message, code=None, kind=None, param=None, **fields: Any) -> dict:
        """`{"ok": false, "error": message}`, with any fields shown beside it."""
        return {"ok": False, "error": message, **fields}

    def stream_error_event(self, message: str, kind: str | None = None) -> dict:
        return {"type": "error", "error": message}


class SocketSurface(Surface):
    name = "socket"
    prefixes = ("/ws/",)

    def error(self, status, message, code=None, kind=None, param=None, **fields: Any) -> dict:
        """A `{"type": "error", "message"}` frame, with any fields beside it."""
        return {"type": "error", "message": message, **fields}

    def stream_error_event(self, message: str, kind: str | None = None) -> dict:
        return self.error(500, message)


OPENAI, ANTHROPIC, RESPONSES, API, SOCKET = Surface(), AnthropicSurface(), ResponsesSurface(), ApiSurface(), \
    SocketSurface()
_BY_PREFIX = [(prefix, s) for s in (ANTHROPIC, RESPONSES, API, SOCKET) for prefix in s.prefixes]
BY_NAME = {s.name: s for s in (OPENAI, ANTHROPIC, RESPONSES, API, SOCKET)}


_NUMBER_KEY = b'"sequence_number":'
_NUMBER = re.compile(rb'"sequence_number":\s*(\d+)(?=[\s,}])')  # whole digits only: a cut number is no number
_NUMBER_SPAN = 64  # more than a number and its key, however the bytes were cut


def last_sequence_number(data: bytes | bytearray) -> int | None:
    """The `sequence_number` of the last event in a stream's bytes `data`
    that shows one whole (None: none does). A string inside an event that
    holds the same words is escaped (`\\"sequence_number\\"`), so only an
    event's own number matches, and it is the first of the event's fields."""
    at = len(data)
    while (at := data.rfind(_NUMBER_KEY, 0, at)) >= 0:
        found = _NUMBER.match(data, at)
        if found:
            return int(found.group(1))
    return None


class EventNumbers:
    """The number of the last event passed on (`last`), for a stream read
    chunk by chunk, cut anywhere, with nothing kept of it but a few bytes."""

    def __init__(self) -> None:
        self.last: int | None = None
        self._carry = b""

    def feed(self, chunk: bytes) -> None:
        window = self._carry + chunk
        found = last_sequence_number(window)
        if found is not None:
            self.last = found
        self._carry = window[-_NUMBER_SPAN:]


def for_path(path: str) -> Surface:
    """The surface that answers `path`, for the layers that answer before a
    route is found (everything else reads `request.surface`)."""
    for prefix, surface in _BY_PREFIX:
        if path.startswith(prefix):
            return surface
    return OPENAI


def of(request) -> Surface:
    """The surface of a request a route runs (its router marked it), else by its path."""
    return getattr(request, "surface", None) or for_path(request.path)
