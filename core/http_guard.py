"""Bounds at the HTTP connection, before Django sees a request (daphne on
Twisted buffers a whole body before it hands the request on, so a cap
checked later would come after the memory was spent).

- A body larger than `max_body_bytes` is answered 413 as soon as its
  `Content-Length` arrives (or, sent chunked, as soon as it passes the
  cap); nothing of it is kept, `Expect: 100-continue` gets no 100, and
  the connection closes once the answer is out.
- A request's headers must arrive within `header_timeout_s` of its first
  byte, and its body within `body_timeout_s` after them (slow-drip
  clients are answered 408 and dropped); a keep-alive connection idle for
  `idle_timeout_s` is closed. A request being answered (a long
  generation, a stream) is never timed out here.
- A request line or header line over Twisted's 16 KiB line cap (a query
  string of 20 KB) is answered 414 (431 for a header), and a request whose
  line and headers pass 16 KiB together 431: Twisted would drop the
  connection without a word, or answer a bare 400.
- A response is written no faster than its client reads: while the
  connection's send buffer is full, the app's next write waits (daphne
  would otherwise buffer a whole stream in memory for a client that reads
  nothing), and a client that takes nothing from a full buffer for
  `write_timeout_s` has its connection cut, which the app sees as a
  disconnect (a generation streaming to it stops).

Refusals come in the shape of the route they were sent to: OpenAI's on
`/v1`, Anthropic's on `/v1/messages`, `{"ok": false}` on `/api`.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any, Protocol, cast

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web import http

from core import surfaces
from core.limits import current as current_limits

log = logging.getLogger("hearth.http")

LINGER_S = 5.0  # after a refusal, how long the rest of a body may still arrive before the connection is cut
REQUEST_LINE = re.compile(rb"[A-Z]+ (\S+)")  # the start of a request line: its method and target


class _Timer(Protocol):
    def active(self) -> bool: ...

    def cancel(self) -> None: ...


class _Clock(Protocol):
    def callLater(self, delay: float, fn: Callable[..., object], *args: object) -> _Timer: ...


def clock() -> _Clock:
    """The running reactor, as the timer source this module uses. Twisted
    types it with zope interfaces, whose methods mypy reads right only
    through the mypy-zope plugin."""
    from twisted.internet import reactor

    return cast(_Clock, reactor)


def _refuse(channel, status: int, reason: bytes, message: str, code: str, target: bytes | None = None) -> None:
    """Write a complete answer and close: nothing more is read into memory. `target`: the request's,
    when the channel has not parsed it (its shape is the route's)."""
    path = (target or getattr(channel, "_path", b"") or b"/").split(b"?", 1)[0].decode("latin-1")
    body = surfaces.for_path(path).error_bytes(status, message, code)
    head = (f"HTTP/1.1 {status} ".encode() + reason + b"\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n".encode() + b"Connection: close\r\n\r\n")
    channel.refused = True
    if isinstance(channel, GuardedChannel):
        channel._disarm()  # this answer is the last on the connection: no 408 after it
    transport = channel.transport
    transport.write(head + body)
    transport.loseWriteConnection() if hasattr(transport, "loseWriteConnection") else transport.loseConnection()
    clock().callLater(LINGER_S, lambda: transport.connected and transport.abortConnection())


class Paced:
    """A connection whose writes go at its client's pace (an HTTP channel,
    a WebSocket): the transport calls `pauseProducing` and `resumeProducing`
    as its send buffer fills past its high-water mark and empties again;
    the app's next write awaits `writable`; a client that takes nothing
    from a full buffer for `write_timeout_s` is cut (`_cut`)."""
    transport: Any
    _stall: _Timer | None = None  # armed while the send buffer is full
    _writers: list[asyncio.Future] | None = None  # app writes waiting for the buffer to drain
    STALLED = "cutting a client that read nothing for %g s (--write-timeout)"

    def _buffer_full(self) -> bool:
        raise NotImplementedError

    def _cut(self, seconds: float) -> None:
        self.transport.abortConnection()

    def _paused(self) -> None:
        if self._stall is None:
            self._stall = clock().callLater(current_limits().write_timeout_s, self._stalled)

    async def writable(self) -> None:
        """Return once the send buffer has room (at once unless the client
        has stopped reading), or the connection is gone."""
        while self._buffer_full() and self.transport is not None and self.transport.connected:
            waiter = asyncio.get_running_loop().create_future()
            self._writers = (self._writers or []) + [waiter]
            await waiter

    def _drained(self) -> None:
        if self._stall is not None and self._stall.active():
            self._stall.cancel()
        self._stall = None
        writers, self._writers = self._writers or [], None
        for waiter in writers:
            if not waiter.done():
                waiter.set_result(None)

    def _stalled(self) -> None:
        self._stall = None
        seconds = current_limits().write_timeout_s
        log.info(self.STALLED, seconds)
        if self.transport is not None and self.transport.connected:
            self._cut(seconds)


class GuardedRequest(WebRequest):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Django reads form bodies itself; Twisted's own multipart parse would
        # answer a malformed one with a bare 400 before the app could say why.
        self._parsePOSTFormSubmission = False

    def gotLength(self, length):
        self.received = 0
        cap = current_limits().max_body_bytes
        if length is not None and length > cap:
            self.requestHeaders.removeHeader(b"Expect")  # no 100 Continue: the body is not wanted
            _refuse(self.channel, 413, b"Content Too Large", f"the request body is {length} bytes; this server "
                    f"takes at most {cap} (--max-body-bytes)", "request_too_large")
            return
        super().gotLength(length)

    def handleContentChunk(self, data):
        if getattr(self.channel, "refused", False):
            return
        self.received += len(data)
        cap = current_limits().max_body_bytes
        if self.received > cap:
            _refuse(self.channel, 413, b"Content Too Large", f"the request body is over {cap} bytes "
                    "(--max-body-bytes)", "request_too_large")
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version):
        if not getattr(self.channel, "refused", False):
            super().requestReceived(command, path, version)


class GuardedChannel(Paced, http.HTTPChannel):
    STALLED = "cutting a client that read nothing of its response for %g s (--write-timeout)"
    refused = False
    _deadline: _Timer | None = None

    def connectionMade(self):
        # Twisted annotates timeOut as int; its timers take float seconds.
        self.timeOut = current_limits().idle_timeout_s  # type: ignore[assignment]
        super().connectionMade()

    def dataReceived(self, data):
        if self.refused:
            return  # the rest of a refused body: dropped as it comes
        if self._deadline is None and not self._handlingRequest:
            self._arm(current_limits().header_timeout_s, "headers")
        super().dataReceived(data)

    def lineReceived(self, line):
        if self.refused:
            return  # the lines after a refusal that came in the same read
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self._too_long(line, whole=True)
            return
        super().lineReceived(line)

    def lineLengthExceeded(self, line):
        self._too_long(line, whole=False)

    def _too_long(self, line: bytes, whole: bool) -> None:
        """Answer a request line or header over Twisted's caps (LineReceiver.MAX_LENGTH for one line,
        totalHeadersSize for the request line and headers together) in its route's shape."""
        start = REQUEST_LINE.match(line)  # the request line: its target names the route, and the answer's shape
        target = start.group(1) if start is not None else None
        if target is not None and not whole:
            _refuse(self, 414, b"URI Too Long", f"the request line is over {self.MAX_LENGTH} bytes: a URL "
                    "(its query string included) this long is not taken; send the parameters in a body",
                    "uri_too_long", target)
            return
        cap = self.totalHeadersSize if whole else self.MAX_LENGTH
        what = "the request line and headers together are" if whole else "a header line is"
        _refuse(self, 431, b"Request Header Fields Too Large", f"{what} over {cap} bytes", "headers_too_large",
                target)

    def allHeadersReceived(self):
        super().allHeadersReceived()
        if not self.refused:
            self._arm(current_limits().body_timeout_s, "body")

    def allContentReceived(self):
        self._disarm()
        if not self.refused:
            super().allContentReceived()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        self._drained()
        super().connectionLost(reason)

    # The transport calls these as its send buffer fills past its high-water mark and empties again.
    def pauseProducing(self):
        super().pauseProducing()
        self._paused()

    def resumeProducing(self):
        super().resumeProducing()
        self._drained()

    def _buffer_full(self) -> bool:
        return self._waitingForTransport

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = clock().callLater(seconds, self._too_slow, seconds, what)

    def _disarm(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _too_slow(self, seconds: float, what: str) -> None:
        self._deadline = None
        flag = "--header-timeout" if what == "headers" else "--body-timeout"
        _refuse(self, 408, b"Request Timeout", f"the request's {what} did not arrive within {seconds:g} s ({flag})",
                "request_timeout")


class GuardedHTTPFactory(HTTPFactory):
    """daphne's factory, building guarded channels and requests."""

    def protocol(self):
        return http._GenericHTTPChannelProtocol(GuardedChannel())

    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = GuardedRequest
        return protocol


async def _paced(send, server, protocol, message):
    """daphne's `Server.handle_reply` (the app's ASGI `send`), waiting first
    while the connection's send buffer is full: a response's body, or a
    frame on a guarded WebSocket."""
    channel = getattr(protocol, "channel", None)
    if isinstance(channel, GuardedChannel) and message.get("type") == "http.response.body":
        await channel.writable()
    elif message.get("type") == "websocket.send" and hasattr(protocol, "writable"):  # core/ws_guard.py
        await protocol.writable()
    await send(server, protocol, message)


def install() -> None:
    """Make daphne's Server build guarded connections (it names its factory
    at run time) and write responses at the pace their clients read."""
    import daphne.server

    daphne.server.HTTPFactory = GuardedHTTPFactory
    send = daphne.server.Server.handle_reply
    if not getattr(send, "hearth_paced", False):
        async def handle_reply(self, protocol, message):
            await _paced(send, self, protocol, message)

        handle_reply.hearth_paced = True  # type: ignore[attr-defined]
        daphne.server.Server.handle_reply = handle_reply
