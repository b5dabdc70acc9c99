"""Django's own middlewares (security headers, sessions, common, CSRF, auth,
messages), with their hooks run on the event loop.

Django's `MiddlewareMixin.__acall__` runs each `process_request` and
`process_response` through `sync_to_async(thread_sensitive=True)`, and the
handler does the same to a sync `process_view`: a hop to the one shared
sync thread and back, ten of them per request for these six, whatever the
request. Under a burst of requests they queue behind each other on that
thread (32 concurrent one-token chat requests: 150 ms median with the hops,
115 ms without them, on 2 cores). The hooks below do no I/O of their own,
so they run in place; the two that can reach the database keep the hop for
the requests where they do:

- `SessionMiddleware.process_response` saves a modified session (a session
  that is only read was loaded by whoever read it, in its own context);
- `MessageMiddleware.process_response` stores messages that were read or
  added, which may write to the session.

The CSRF hooks read the session only with `CSRF_USE_SESSIONS`, which
Hearth's settings leave off (the token lives in its cookie)."""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.middleware import common, csrf, security


class _OnLoop:
    """`MiddlewareMixin.__acall__` with the hooks called in place."""

    def blocks(self, request, response) -> bool:
        """Whether `process_response` may do I/O for this request (it then runs in the sync thread)."""
        return False

    async def __acall__(self, request):
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)  # type: ignore[attr-defined]
        if hasattr(self, "process_response"):
            if self.blocks(request, response):
                response = await sync_to_async(self.process_response, thread_sensitive=True)(request, response)
            else:
                response = self.process_response(request, response)
        return response


class SecurityMiddleware(_OnLoop, security.SecurityMiddleware):
    pass


class SessionMiddleware(_OnLoop, sessions.SessionMiddleware):
    def blocks(self, request, response) -> bool:
        session = getattr(request, "session", None)
        return session is not None and (session.modified or settings.SESSION_SAVE_EVERY_REQUEST) \
            and not session.is_empty()


class CommonMiddleware(_OnLoop, common.CommonMiddleware):
    pass


class CsrfViewMiddleware(_OnLoop, csrf.CsrfViewMiddleware):
    async def process_view(self, request, callback, callback_args, callback_kwargs):
        # An async hook: the handler calls it as it is instead of through sync_to_async.
        return super().process_view(request, callback, callback_args, callback_kwargs)


class AuthenticationMiddleware(_OnLoop, auth.AuthenticationMiddleware):
    pass  # it only sets the lazy `request.user` and `request.auser`


class MessageMiddleware(_OnLoop, messages.MessageMiddleware):
    def blocks(self, request, response) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)
