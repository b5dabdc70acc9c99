"""`/ws/chat`: the dashboard's chat socket.

Frames are JSON objects with a `type`, each in a text message; this module
reads them, hands each to the method that answers its type
(`chat/frames.py`, which does what the frame asks of the chat sessions and
turns) and sends back an error frame (`core.surfaces.SOCKET`) for one it
cannot read or that is refused, keeping the socket open.

The coding tools (read, bash, edit, write) reach the server's machine, so a
socket may turn them on, and a turn offers them, only when it comes from a
loopback address or the auth layer vouched for it
(`scope["hearth_signed_in"]`: a valid API key or a signed-in dashboard)."""
from __future__ import annotations

import ipaddress
import json
import logging

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from chat import live
from chat.frames import ChatFrames, FrameError
from core import jsonbody
from core.surfaces import SOCKET
from inference.protocols import params

log = logging.getLogger("hearth.chat")
MAX_FRAME_CHARS = 2 << 20  # a frame is parsed on the event loop: longer ones are refused unread


class ChatConsumer(AsyncJsonWebsocketConsumer):
    @property
    def runtime(self):
        """The serving process's runtime, handed over by the ASGI router."""
        return self.scope["runtime"]

    async def connect(self):
        # The Host, Origin and key checks ran before the socket reached here (hearth/asgi.py).
        self.chat = ChatFrames(self.runtime, self.send_json, coding_permitted(self.scope))
        await self.accept()
        await self.send_json({**self._ready(), "codingTools": self.chat.may_code})
        await self.chat.send_sessions()

    async def disconnect(self, code):
        await self.chat.unfollow()  # the turn, if one runs, goes on

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            # daphne cancels a socket's app still busy `application_close_timeout` after the close, before
            # `disconnect` runs: its follower would pass the turn on to no one and keep it followed, so a
            # gated tool call would wait for an approval no one can give instead of being denied unattended.
            chat = getattr(self, "chat", None)
            if chat is not None and chat.follower is not None:
                chat.follower.cancel()

    # -- frames ------------------------------------------------------------
    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """Every frame is a JSON object in a text message; anything else is
        answered with an error frame and the socket stays open."""
        if not text_data:
            await self._error("frames must be JSON text messages")
            return
        if len(text_data) > MAX_FRAME_CHARS:
            await self._error(f"a frame may hold at most {MAX_FRAME_CHARS} characters")
            return
        try:
            content = jsonbody.loads(text_data, self.runtime.options.limits.max_json_depth, "frame")
        except jsonbody.JsonRefused as exc:
            await self._error(str(exc))
            return
        await self.receive_json(content, **kwargs)

    @classmethod
    async def encode_json(cls, content):
        return json.dumps(content, ensure_ascii=False, allow_nan=False)  # never a bare NaN the browser cannot parse

    async def receive_json(self, content, **kwargs):
        """A frame of type `t` goes to `ChatFrames.on_t`."""
        kind = content.get("type") if isinstance(content, dict) else None
        handler = getattr(self.chat, f"on_{kind}", None) if isinstance(kind, str) and kind.isidentifier() else None
        if handler is None:
            await self._error(f"unknown frame type {kind!r}")
            return
        try:
            await handler(content)
        except FrameError as exc:
            await self._error(str(exc))
        except Exception as exc:  # a bug must not kill the socket silently
            log.exception("chat frame %s failed", kind)
            await self._error(f"{type(exc).__name__}: {exc}")

    async def _error(self, message: str) -> None:
        await self.send_json(SOCKET.error(400, message))

    # -- the first frame ---------------------------------------------------
    def _ready(self) -> dict:
        from inference.protocols import chat as chat_protocol

        runtime = self.runtime
        if runtime.router is not None:
            return self._router_ready()
        engine = runtime.engine
        model = engine.loaded if engine is not None else None
        defaults = runtime.options.defaults
        return {"type": "ready", "model": model.model_id if model else None,
                "vision": model is not None and model.vision is not None, "audio": False,
                "thinking": chat_protocol.thinks(model) if model else False,
                "transcription": runtime.transcriber is not None and runtime.transcriber.available,
                "genDefaults": params.gen_defaults(defaults, model.generation_config) if model else None,
                "contextWindow": model.context_window if model else None, "router": False,
                "models": [model.model_id] if model else []}

    def _router_ready(self) -> dict:
        """Router mode: the default model, as its process described itself
        once loaded (until then: what the router knows), and the ids a
        session may pick."""
        router = self.runtime.router
        info = live.model_info(self.runtime, None)
        return {"type": "ready", "model": router.default, "vision": False, "audio": False,
                "thinking": bool(info.get("reasoning")), "transcription": False,
                "genDefaults": info.get("gen_defaults"), "contextWindow": info.get("context_window"),
                "router": True, "models": list(router.slots)}


def coding_permitted(scope: dict) -> bool:
    """Signed in (the auth layer sets `hearth_signed_in`), or connected from a
    loopback address; a socket with no known peer is neither."""
    if scope.get("hearth_signed_in") is True:
        return True
    client = scope.get("client")
    try:
        address = ipaddress.ip_address(client[0]) if client else None
    except (ValueError, TypeError, IndexError):
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address is not None and address.is_loopback

