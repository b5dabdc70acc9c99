"""ASGI entry point: Django for HTTP, wrapped so a draining server refuses
new requests, and the dashboard chat's WebSocket at /ws/chat."""
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


from channels.routing import URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from chat.consumer import ChatConsumer  # noqa: E402

application = ProtocolTypeRouter({
    "http": _http,
    "websocket": URLRouter([path("ws/chat", ChatConsumer.as_asgi())]),
})
