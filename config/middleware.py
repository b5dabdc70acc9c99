"""Middleware: every error answer stays JSON, in the OpenAI shape, even the
ones ninja produces before a view runs (405 on a known path); every answer
is counted for /metrics by route and status.

Async-capable on purpose: one sync-only middleware makes Django run the
whole chain through a single worker thread, which would queue every request
behind a long non-streaming generation.
"""
from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import JsonResponse


class _Middleware:
    """Plumbing shared by the middlewares here: sync- and async-capable."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)


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
            message = f"method {request.method} not allowed on {request.path}"
            body = {"error": {"message": message + (f" (allowed: {allowed})" if allowed else ""),
                              "type": "invalid_request_error", "param": None, "code": "method_not_allowed"}}
            return JsonResponse(body, status=405, headers={"Allow": allowed})
        return response


class RequestMetricsMiddleware(_ResponseHook):
    @staticmethod
    def _rewrite(request, response):
        from inference.telemetry import count_request

        match = getattr(request, "resolver_match", None)
        count_request(match.route if match is not None else "unmatched", request.method, response.status_code)
        return response


def host_allowed(host: str) -> bool:
    """Whether a request's Host names this server: loopback names and the
    address `hearth serve` bound, or anything when it bound every interface
    (then set HEARTH_ALLOWED_HOSTS to restrict it). Refusing other names
    stops a DNS-rebinding page, whose Origin and Host agree, from reaching
    the API through the user's browser."""
    from urllib.parse import urlsplit

    from inference.runtime import runtime

    allowed = runtime.allowed_hosts
    if allowed is None:
        return True
    name = urlsplit(f"//{host}").hostname or ""
    return name in allowed


class CrossOriginGuardMiddleware(_Middleware):
    """Refuse requests for a Host name that is not this server's (DNS
    rebinding), and state-changing requests that a web page on another
    origin makes (a browser always sends `Origin` on those): without it, any
    site the user visits could mount adapters, save a Hub token or push a
    folder. SDK clients send no `Origin` and are not affected; the dashboard
    is same-origin."""

    GUARDED = ("/api/", "/v1/", "/admin/cache/")
    SAFE = ("GET", "HEAD", "OPTIONS")
    # GETs that start work (the reference makes synthesis a GET): an <img> on
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
        from urllib.parse import urlsplit

        foreign = origin is not None and (origin == "null" or urlsplit(origin).netloc != host)
        if not host_allowed(host):  # every request: a rebound page could otherwise read chats and settings
            message = f"requests for host {host!r} are refused (not this server's name)"
        elif request.path in self.ACTING_GETS:
            if not foreign and request.headers.get("Sec-Fetch-Site") not in ("cross-site", "same-site"):
                return None
            message = f"{request.path} from another site refused"
        elif request.method in self.SAFE or not request.path.startswith(self.GUARDED) or not foreign:
            return None
        else:
            message = f"cross-origin {request.method} from {origin} refused"
        if not request.path.startswith(("/v1/", "/admin/cache/")):
            return JsonResponse({"ok": False, "error": message}, status=403)
        return JsonResponse({"error": {"message": message, "type": "permission_error", "param": None,
                                       "code": "cross_origin"}}, status=403)
