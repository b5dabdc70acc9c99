"""ASGI entry point: Django for HTTP, wrapped so a draining server refuses
new requests; the static files (the dashboard's, the admin's) by WhiteNoise
beside Django, for their prefixes only (hearth/static.py); and the
dashboard chat's WebSocket at /ws/chat, behind the same Host check and API
key rule as HTTP (see hearth/access.py)."""
import asyncio
import contextvars
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402
from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402

from hearth.request_threads import RequestContext  # noqa: E402


class _Django(ASGIHandler):
    """Django's ASGI handler (what `get_asgi_application()` returns), with each
    request's sync thread from a pool (hearth/request_threads.py)."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        async with RequestContext():
            await self.handle(scope, receive, send)


django.setup(set_prefix=False)
django_app = _Django()

from core import limits, surfaces  # noqa: E402
from hearth import access, static  # noqa: E402
from hearth.root import RUNTIME as runtime  # noqa: E402
from serving.telemetry import count_request  # noqa: E402


async def _answer(send, status: int, body: bytes, extra: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close"), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _declared_length(scope) -> int:
    try:
        return int(_header(scope, b"content-length") or 0)
    except ValueError:
        return 0


async def _static(scope, receive, send):
    """A static file: WhiteNoise, in a thread of this request's own (as
    Django runs a sync view), after the Host check every request passes
    (CrossOriginGuardMiddleware's), for GET and HEAD; counted for /metrics
    as Django's routes are."""
    path, method = scope["path"], scope["method"]
    host = _header(scope, b"host") or ""
    answered = {"status": 500}
    own = contextvars.copy_context()

    async def counted(message):
        if message["type"] == "http.response.start":
            answered["status"] = message["status"]
        # WsgiToAsgi sends from its thread through AsyncToSync, in a context naming that call's executor;
        # daphne starts the connection's next request inside the last send, and that request would inherit
        # the executor, gone by then (django/asgiref#491): the server is sent to from this request's context.
        await own.run(asyncio.ensure_future, send(message))

    surface = surfaces.for_path(path)
    if not access.host_allowed(host):
        await _answer(counted, 403, surface.error_bytes(403, access.refused_host(host), "cross_origin",
                                                        "permission_error"))
    elif method not in ("GET", "HEAD"):
        message = f"method {method} not allowed on {path} (allowed: GET, HEAD)"
        await _answer(counted, 405, surface.error_bytes(405, message, "method_not_allowed"),
                      [(b"allow", b"GET, HEAD")])
    else:
        async with RequestContext():
            await static.application(scope, receive, counted)
    count_request(static.route(path), method, answered["status"])


async def _http(scope, receive, send):
    if runtime.draining:
        body = surfaces.for_path(scope.get("path", "/")).error_bytes(503, "server is shutting down", "shutting_down",
                                                                    "engine_unavailable")
        await _answer(send, 503, body, [(surfaces.DRAINING_HEADER.encode(), b"1")])
        return
    cap = limits.current().max_body_bytes  # daphne refuses these at the connection; other servers get it here
    if _declared_length(scope) > cap:
        message = f"the request body is over {cap} bytes (--max-body-bytes)"
        body = surfaces.for_path(scope.get("path", "/")).error_bytes(413, message, "request_too_large")
        await _answer(send, 413, body)
        return
    runtime.inflight += 1  # a draining server waits for these to finish
    try:
        if static.serves(scope.get("path", "")):
            await _static(scope, receive, send)
        else:
            await django_app(scope, receive, send)
    finally:
        runtime.inflight -= 1


from channels.routing import URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from chat.consumer import ChatConsumer  # noqa: E402

sockets = URLRouter([path("ws/chat", ChatConsumer.as_asgi())])


async def _socket_signed_in(headers: dict) -> bool:
    """A key in the handshake's headers, or the dashboard's signed-in session cookie."""
    from importlib import import_module

    from django.conf import settings
    from django.http.cookie import parse_cookie

    key = access.presented_key(headers)
    if key is not None:
        return access.key_accepted(key)
    session_key = parse_cookie(headers.get("cookie", "")).get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        return False
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return access.session_signed_in({access.SESSION_KEY: await session.aget(access.SESSION_KEY)})


async def _websocket(scope, receive, send):
    """Another site's page may not drive the chat, nor one reaching us through
    a rebound DNS name (close code 4403); with keys configured, a socket
    without the key or a signed-in session is refused too (4401). The
    socket is accepted and then closed, so the browser sees the code."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
    host = headers.get("host", "")
    refused = None
    if access.cross_origin(headers.get("origin"), host) or not access.host_allowed(host):
        refused = 4403
    signed_in = refused is None and access.keys_required() and await _socket_signed_in(headers)
    if refused is None and access.keys_required() and not signed_in:
        refused = 4401
    if refused is not None:
        await receive()  # the handshake
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": refused})
        return
    from django.conf import settings

    # Behind a proxy the peer address is the proxy's: nobody counts as local.
    peer = None if settings.HEARTH_BEHIND_PROXY else scope.get("client")
    await sockets(dict(scope, client=peer, hearth_signed_in=signed_in, runtime=runtime), receive, send)


application = ProtocolTypeRouter({
    "http": _http,
    "websocket": _websocket,
})
