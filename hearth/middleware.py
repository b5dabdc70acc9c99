"""Middleware: every error answer stays JSON, in the OpenAI shape, even the
ones ninja produces before a view runs (405 on a known path); every answer
is counted for /metrics by route and status; requests for another Host
name, cross-origin writes from origins the operator did not allow, and
requests without a key (when keys are configured) are refused; allowed
origins get CORS headers; an identical retry of a resumable stream
follows the stream it repeats.

Async-capable on purpose: one sync-only middleware makes Django run the
whole chain through a single worker thread, which would queue every request
behind a long non-streaming generation.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import quote

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.http import HttpResponse, HttpResponseRedirect
from django.urls import Resolver404, resolve

from core import holders, surfaces
from hearth import access
from hearth.root import RUNTIME as runtime
from serving import traces
from serving.routes import proxy
from serving.routes.pipeline import replay_key
from serving.streams.store import StreamRefused, check_id

log = logging.getLogger("hearth.streams")
requests_log = logging.getLogger("hearth.requests")


class _Middleware:
    """Plumbing shared by the middlewares here: sync- and async-capable."""

    sync_capable = True
    async_capable = True

    if TYPE_CHECKING:  # every middleware below defines it; markcoroutinefunction wants a callable
        def __call__(self, request): ...

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)


class RuntimeMiddleware(_Middleware):
    """Hands every request the process's runtime (`request.runtime`): views
    below the composition root read it there, never from a global."""

    def __call__(self, request):
        request.runtime = runtime
        return self.get_response(request)


class TraceMiddleware(_Middleware):
    """Every request gets its trace id (`request.trace_id`: the one it sent,
    checked, or a new one; serving/traces.py), and every answer carries it."""

    def __call__(self, request):
        refused = None
        try:
            request.trace_id = traces.trace_id(request.headers.get(traces.HEADER))
        except traces.BadTraceId as exc:
            request.trace_id = traces.trace_id(None)
            refused = surfaces.of(request).response(400, str(exc), param=traces.HEADER)
        if self.is_async:
            return self._acall(request, refused)
        return self._tag(request, refused or self.get_response(request))

    async def _acall(self, request, refused):
        return self._tag(request, refused or await self.get_response(request))

    @staticmethod
    def _tag(request, response):
        response[traces.HEADER] = request.trace_id
        return response


class _ResponseHook(_Middleware):
    """A middleware that only looks at (request, response)."""

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        return self._rewrite(request, self.get_response(request))

    async def _acall(self, request):
        return self._rewrite(request, await self.get_response(request))

    @staticmethod
    def _rewrite(request, response):
        raise NotImplementedError


class JsonErrorMiddleware(_ResponseHook):
    @staticmethod
    def _rewrite(request, response):
        if response.status_code == 405 and not response.get("Content-Type", "").startswith("application/json"):
            allowed = response.get("Allow", "")
            message = f"method {request.method} not allowed on {request.path}" + (
                f" (allowed: {allowed})" if allowed else "")
            return surfaces.of(request).response(405, message, "method_not_allowed", headers={"Allow": allowed})
        return response


CLIENT_GONE = 499  # counted (nginx's code) for a request whose client went away before its answer


class RequestMetricsMiddleware(_ResponseHook):
    """Counts every answer by route, method and status; a request whose
    client hung up before the answer (Django cancels its view) counts as a
    499 and says so in the log, with how long it ran."""

    async def _acall(self, request):
        started = time.monotonic()
        try:
            response = await self.get_response(request)
        except asyncio.CancelledError:
            self._count(request, CLIENT_GONE)
            kept = getattr(request, "hearth_kept", False)  # a resumable stream that runs on without it
            requests_log.info("trace=%s %s %s %d: the client went away after %.0f ms; %s",
                     getattr(request, "trace_id", "-"), request.method, request.path, CLIENT_GONE,
                     (time.monotonic() - started) * 1000,
                     "its stream goes on (X-Conversation-Id)" if kept else "its work stopped")
            raise
        return self._rewrite(request, response)

    @classmethod
    def _rewrite(cls, request, response):
        cls._count(request, response.status_code)
        return response

    @staticmethod
    def _count(request, status: int) -> None:
        from serving.telemetry import count_request

        match = getattr(request, "resolver_match", None)
        count_request(match.route if match is not None else "unmatched", request.method, status)


class CrossOriginGuardMiddleware(_Middleware):
    """Refuse requests for a Host name that is not this server's (DNS
    rebinding), and every state-changing request that a web page on another
    origin makes, on every route (a browser always sends `Origin` on those,
    whatever the content type: a `text/plain` or form body needs no
    preflight): without it, any site the user visits could load and unload
    models, mount adapters, save a Hub token or push a folder. SDK clients
    send no `Origin` and are not affected; the dashboard is same-origin;
    origins named with `--cors-origin` pass."""

    SAFE = ("GET", "HEAD", "OPTIONS")
    # Answered for any origin on purpose (serving/routes/curve_designer.py): they compute, and change nothing.
    ANY_ORIGIN = ("/signal", "/generate")
    # GETs that start work (GET /v1/memory/synthesize starts a synthesis): an <img> on
    # another site sends no Origin, but browsers mark it Sec-Fetch-Site.
    ACTING_GETS = ("/v1/memory/synthesize",)

    def __call__(self, request):
        refused = self._refuse(request)
        if self.is_async:
            return self._acall(request, refused)
        return refused if refused is not None else self.get_response(request)

    async def _acall(self, request, refused):
        return refused if refused is not None else await self.get_response(request)

    def _refuse(self, request):
        origin = request.headers.get("Origin")
        host = request.headers.get("Host", "")
        foreign = access.cross_origin(origin, host) and not access.origin_allowed(origin)
        if not access.host_allowed(host):  # every request: a rebound page could otherwise read chats and settings
            message = access.refused_host(host)
        elif request.path in self.ACTING_GETS:
            if not foreign and request.headers.get("Sec-Fetch-Site") not in ("cross-site", "same-site"):
                return None
            message = f"{request.path} from another site refused"
        elif request.method in self.SAFE or request.path in self.ANY_ORIGIN or not foreign:
            return None
        else:
            message = f"cross-origin {request.method} from {origin} refused"
        return surfaces.of(request).response(403, message, "cross_origin", "permission_error")


class SecureCookiesOverTlsMiddleware(_ResponseHook):
    """Cookies set on an HTTPS request are marked Secure (plain HTTP on
    loopback keeps working; behind TLS the session never leaks to HTTP)."""

    @staticmethod
    def _rewrite(request, response):
        if request.is_secure():
            for cookie in response.cookies.values():
                cookie["secure"] = True
        return response


def _vary_origin(response) -> None:
    vary = response.get("Vary")
    if "origin" not in (vary or "").lower():
        response["Vary"] = f"{vary}, Origin" if vary else "Origin"


class CorsMiddleware(_Middleware):
    """CORS for the origins the operator named (`--cors-origin`), and no
    other: a preflight from one of them is answered here (it carries no
    key), and their answers, errors included, carry the Allow-Origin header
    so the page can read them. With any origin configured every answer
    varies by Origin, so a cache never hands one origin's answer to another.
    Cookies are never allowed cross-origin: such a page authenticates with a
    key (ApiKeyMiddleware ignores the session on a cross-origin request)."""

    METHODS = "GET, POST, PUT, DELETE, OPTIONS"

    def __call__(self, request):
        if not runtime.cors_origins:
            return self.get_response(request)
        origin = request.headers.get("Origin")
        allowed = access.origin_allowed(origin)
        if allowed and request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return self._preflight(request, origin)
        if self.is_async:
            return self._acall(request, origin if allowed else None)
        return self._headers(self.get_response(request), origin if allowed else None)

    async def _acall(self, request, origin):
        return self._headers(await self.get_response(request), origin)

    @staticmethod
    def _headers(response, origin: str | None):
        if origin is not None:
            response["Access-Control-Allow-Origin"] = origin
            response["Access-Control-Expose-Headers"] = "*"
        _vary_origin(response)
        return response

    def _preflight(self, request, origin):
        response = self._headers(HttpResponse(status=204), origin)
        response["Access-Control-Allow-Methods"] = self.METHODS
        asked = request.headers.get("Access-Control-Request-Headers")
        if asked:
            response["Access-Control-Allow-Headers"] = asked
        response["Access-Control-Max-Age"] = "600"
        if self.is_async:
            async def answer():
                return response
            return answer()
        return response


class ApiKeyMiddleware(_Middleware):
    """With keys configured (`--api-key`, `--api-key-file`, HEARTH_API_KEY),
    every request but the public few needs one: in a header, or through the
    dashboard's signed-in session. The refusal is a 401 in the caller's
    protocol; a browser navigating to a page is sent to the sign-in page."""

    def __call__(self, request):
        if not access.keys_required() or access.is_public(request.path, request.method):
            return self.get_response(request)
        key = access.presented_key(request.headers)
        # The session cookie counts only for this server's own pages: a page
        # on a --cors-origin origin may send it (same-site), but must use a key.
        by_cookie = key is None and not access.cross_origin(request.headers.get("Origin"),
                                                            request.headers.get("Host", ""))
        if self.is_async:
            return self._acall(request, key, by_cookie)
        if access.key_accepted(key) or (by_cookie and access.session_signed_in(request.session)):
            self._admit(request, key, request.session.get(access.SESSION_KEY) if key is None else None)
            return self.get_response(request)
        return refusal(request, key)

    async def _acall(self, request, key, by_cookie):
        if access.key_accepted(key) or (by_cookie and await access.request_signed_in(request)):
            self._admit(request, key, await request.session.aget(access.SESSION_KEY) if key is None else None)
            return await self.get_response(request)
        return refusal(request, key)

    @staticmethod
    def _admit(request, key: str | None, session_digest: str | None) -> None:
        request.hearth_signed_in = True  # what may run commands here asks (chat/api.py, like the socket)
        request.hearth_holder = access.holder(key, session_digest, request.headers.get(holders.HEADER))


def refusal(request, key: str | None):
    """The 401 for a request without an accepted key, in its protocol's shape."""
    message = ("invalid API key" if key else
               "an API key is required: send `Authorization: Bearer KEY` or `x-api-key: KEY`")
    path = request.path
    if request.method == "GET" and not path.startswith(("/v1", "/api/")) \
            and "text/html" in request.headers.get("Accept", ""):
        return HttpResponseRedirect("/signin?next=" + quote(request.get_full_path(), safe="/"))
    return surfaces.of(request).response(401, message, "invalid_api_key",
                                         headers={"WWW-Authenticate": 'Bearer realm="hearth"'})


class ReplayMiddleware(_Middleware):
    """An identical retry of a resumable stream (serving/streams/store.py:
    the same POST, body and key on the same X-Conversation-Id, whose stream is
    live or ended `done`) follows that stream from its first byte instead of
    generating again, in either mode and with Redis on any web node. Its
    answer says so: `X-Hearth-Replayed: live` or `done`. After the access
    checks (a stream is its key's); anything else goes on as it came."""

    def __call__(self, request):
        # Streams live on the server's event loop: only an async chain (daphne's) can follow one.
        if not self.is_async or request.method != "POST" or not request.headers.get("X-Conversation-Id", "").strip():
            return self.get_response(request)
        return self._acall(request)

    async def _acall(self, request):
        replayed = await _replayed(request)
        return replayed if replayed is not None else await self.get_response(request)


async def _replayed(request):
    """The replay answering `request`, or None when it is not an identical retry."""
    try:
        conversation = check_id(request.headers["X-Conversation-Id"].strip())
    except StreamRefused:
        return None  # the route refuses the id, in its protocol's shape
    stream = await request.runtime.streams.replayable(conversation, holders.of(request), lambda: replay_key(request))
    if stream is None:
        return None
    try:  # counted in /metrics under its route, as if the route had answered
        request.resolver_match = resolve(request.path_info)
    except Resolver404:
        pass
    log.info("conversation %s: an identical retry follows its %s stream instead of generating again",
             conversation, stream.meta.state)
    headers = {"X-Conversation-Id": conversation, "X-Hearth-Replayed": stream.meta.state}
    return surfaces.for_path(request.path).sse(stream.follow(0), headers)


class RouterMiddleware(_Middleware):
    """Router mode: a `/v1` request (and `/fit`, the Curve Designer's
    `/signal` and `/generate`) goes to the process of the model it names
    (serving/routes/proxy.py), after the access checks above; everything
    else is answered here."""

    def __call__(self, request):
        if request.runtime.router is None or request.method == "OPTIONS" or not proxy.routed(request.path):
            return self.get_response(request)
        try:  # the route label of /metrics, as if the request were answered here
            request.resolver_match = resolve(request.path_info)
        except Resolver404:
            pass
        if self.is_async:
            return proxy.dispatch(request)
        return async_to_sync(proxy.dispatch)(request)
