"""Bounds on a WebSocket connection, as `core/http_guard.py` keeps them on
HTTP: daphne (over autobahn) hands the app every frame a client sends at
once, into a queue with no bound, and buffers every frame the app sends
for as long as the client leaves it unread.

- A frame is written no faster than its client reads: while the
  connection's send buffer is full, the app's next `websocket.send` waits
  (`http_guard` paces it with `writable`), and a client that takes
  nothing from a full buffer for `write_timeout_s` is closed with code
  1008 and its connection cut, which the app sees as a disconnect.
- A client's frames are read no faster than the app takes them: while
  `MAX_UNTAKEN` frames wait for the app, the socket is not read, so what
  the client sends next waits in its own buffers (TCP's flow control)
  instead of the server's memory. Nothing is dropped or refused: frames
  are answered in order, at the pace the app answers them.

So one socket holds at most a full send buffer and `MAX_UNTAKEN` frames,
plus any more that the read that reached them completed (autobahn parses
the whole of a read; one is at most 64 KiB), each at most the message size
daphne is started with, in the server.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import logging

from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure

from core.http_guard import Paced, clock

log = logging.getLogger("hearth.http")

MAX_UNTAKEN = 8  # frames received and not yet taken by the app; past it the socket is not read
RESUME_AT = 2  # reading resumes once the app has taken all but this many
POLL_S = 0.02  # how often a socket not being read looks at its queue: daphne's queue tells no one of a get
CLOSE_STALLED = 1008  # policy violation: the client broke the server's --write-timeout


class GuardedWebSocketProtocol(Paced, WebSocketProtocol):
    STALLED = "closing a socket whose client read nothing for %g s (--write-timeout)"
    _full = False  # the send buffer is full: writes wait
    _not_reading = False

    def connectionMade(self):
        super().connectionMade()
        # The transport still reports its send buffer to the HTTP channel the socket was upgraded from,
        # which no longer writes to it: from now on this protocol is the one told.
        self.transport.unregisterProducer()
        self.transport.registerProducer(self, True)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._drained()
        super().connectionLost(reason)

    # -- writing ---------------------------------------------------------------
    # The transport calls these as its send buffer fills past its high-water mark and empties again.
    def pauseProducing(self):
        self._full = True
        self._paused()

    def resumeProducing(self):
        self._drained()

    def stopProducing(self):
        self._drained()

    def _buffer_full(self) -> bool:
        return self._full

    def _drained(self) -> None:
        self._full = False
        super()._drained()

    def _cut(self, seconds: float) -> None:
        # The close frame goes behind what the client left unread: it reads it if it ever reads again.
        # No closing handshake is waited for: the connection goes now. (autobahn's `sendClose` takes only
        # the codes an application may choose, 1000 and 3000-4999; 1008 is the protocol's own.)
        try:
            self.sendCloseFrame(code=CLOSE_STALLED, reasonUtf8=f"read nothing for {seconds:g} s "
                                                               "(--write-timeout)".encode())
        finally:
            self.transport.abortConnection()

    # -- reading ---------------------------------------------------------------
    def onMessage(self, payload, isBinary):
        super().onMessage(payload, isBinary)
        queue = getattr(self, "application_queue", None)
        if queue is not None and not self._not_reading and queue.qsize() >= MAX_UNTAKEN:
            self._not_reading = True
            self.transport.pauseProducing()
            clock().callLater(POLL_S, self._maybe_read)

    def _maybe_read(self) -> None:
        if self.transport is None or not self.transport.connected:
            return
        if self.application_queue.qsize() > RESUME_AT:
            clock().callLater(POLL_S, self._maybe_read)
            return
        self._not_reading = False
        self.transport.resumeProducing()


class GuardedWebSocketFactory(WebSocketFactory):
    protocol = GuardedWebSocketProtocol


def install() -> None:
    """Make daphne's Server build guarded sockets (it names its factory at run time)."""
    import daphne.server

    daphne.server.WebSocketFactory = GuardedWebSocketFactory
