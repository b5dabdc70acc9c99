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


class _ResponseHook:
    """Plumbing for a middleware that only looks at (request, response)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

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


class CrossOriginGuardMiddleware:
    """Refuse state-changing requests that a web page on another origin
    makes to this server (a browser always sends `Origin` on those): without
    it, any site the user visits could mount adapters, save a Hub token or
    push a folder. SDK clients send no `Origin` and are not affected; the
    dashboard is same-origin."""

    sync_capable = True
    async_capable = True
    GUARDED = ("/api/", "/v1/", "/admin/cache/")
    SAFE = ("GET", "HEAD", "OPTIONS")

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        refused = self._refuse(request)
        if self.is_async:
            return self._acall(request, refused)
        return refused if refused is not None else self.get_response(request)

    async def _acall(self, request, refused):
        return refused if refused is not None else await self.get_response(request)

    def _refuse(self, request):
        origin = request.headers.get("Origin")
        if origin is None or request.method in self.SAFE or not request.path.startswith(self.GUARDED):
            return None
        from urllib.parse import urlsplit

        if origin != "null" and urlsplit(origin).netloc == request.get_host():
            return None
        message = f"cross-origin {request.method} from {origin} refused"
        if request.path.startswith("/api/"):
            return JsonResponse({"ok": False, "error": message}, status=403)
        return JsonResponse({"error": {"message": message, "type": "permission_error", "param": None,
                                       "code": "cross_origin"}}, status=403)
