"""ASGI entry point: Django for HTTP, wrapped so a draining server refuses
new requests, and the dashboard chat's WebSocket at /ws/chat, behind the
same Host check and API key rule as HTTP (see config/access.py)."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_app = ASGIStaticFilesHandler(get_asgi_application())

from inference.runtime import runtime  # noqa: E402


async def _http(scope, receive, send):
    if runtime.draining:
        body = b'{"error":{"message":"server is shutting down","type":"engine_unavailable"}}'
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
        return
    runtime.inflight += 1  # a draining server waits for these to finish
    try:
        await django_app(scope, receive, send)
    finally:
        runtime.inflight -= 1


from urllib.parse import urlsplit  # noqa: E402

from channels.routing import URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from chat.consumer import ChatConsumer  # noqa: E402
from config import access  # noqa: E402

sockets = URLRouter([path("ws/chat", ChatConsumer.as_asgi())])


async def _socket_signed_in(headers: dict) -> bool:
    """A key in the handshake's headers, or the dashboard's signed-in session cookie."""
    from http.cookies import SimpleCookie
    from importlib import import_module

    from django.conf import settings

    key = access.presented_key(headers)
    if key is not None:
        return access.key_accepted(key)
    cookie = SimpleCookie()
    cookie.load(headers.get("cookie", ""))
    morsel = cookie.get(settings.SESSION_COOKIE_NAME)
    if morsel is None or not morsel.value:
        return False
    session = import_module(settings.SESSION_ENGINE).SessionStore(morsel.value)
    return access.session_signed_in({access.SESSION_KEY: await session.aget(access.SESSION_KEY)})


async def _websocket(scope, receive, send):
    """Another site's page may not drive the chat, nor one reaching us through
    a rebound DNS name (4403); with keys configured, a socket without the key
    or a signed-in session is refused too (4401). Closing before accepting
    answers the handshake with 403."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
    host, origin = headers.get("host", ""), headers.get("origin")
    signed_in = access.keys_required() and await _socket_signed_in(headers)
    refused = 4403 if (origin and urlsplit(origin).netloc != host) or not access.host_allowed(host) else \
        4401 if access.keys_required() and not signed_in else None
    if refused is not None:
        await receive()
        await send({"type": "websocket.close", "code": refused})
        return
    await sockets(dict(scope, hearth_signed_in=signed_in), receive, send)


application = ProtocolTypeRouter({
    "http": _http,
    "websocket": _websocket,
})
