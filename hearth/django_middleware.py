"""Django's own middlewares (security headers, sessions, common, CSRF, auth,
messages), with their hooks run on the event loop.

Django's `MiddlewareMixin.__acall__` runs each `process_request` and
`process_response` through `sync_to_async(thread_sensitive=True)`, and the
handler does the same to a sync `process_view`: a hop to the one shared
sync thread and back, twelve of them per request for these six, whatever
the request. Under a burst of requests they queue behind each other on
that thread (32 concurrent one-token chat requests: 150 ms median with the
hops, 120 ms without them, on 2 cores). The hooks below do no I/O of their
own, so they run in place; the two that can reach the database keep the
hop for the requests where they do:

- `SessionMiddleware.process_response` saves a modified session (a session
  that is only read was loaded by whoever read it, in its own context);
- `MessageMiddleware.process_response` stores messages that were read or
  added, which may write to the session.

With `CSRF_USE_SESSIONS` (Hearth's settings leave it off: the token lives
in its cookie) every CSRF hook reads the session, so they all hop as in
Django. Under a sync handler (WSGI, `django.test.Client`) nothing changes.

Django's deploy checks (`check --deploy`) look these middlewares up by
their own dotted paths; `deploy_checks` runs the ones that depend on them
with the paths Django knows, and settings silence the ones that would
report them missing (`SILENCED_SYSTEM_CHECKS`)."""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.core import checks
from django.middleware import common, csrf, security


class _OnLoop:
    """`MiddlewareMixin.__acall__` with the hooks called in place."""

    def __init__(self, get_response):
        super().__init__(get_response)  # type: ignore[call-arg]
        self.in_place = self.async_mode and self.may_run_in_place()  # type: ignore[attr-defined]

    def may_run_in_place(self) -> bool:
        """Whether no hook can do I/O whatever the request (else all of them hop, as in Django)."""
        return True

    def blocks(self, request, response) -> bool:
        """Whether `process_response` may do I/O for this request (it then runs in the sync thread)."""
        return False

    async def __acall__(self, request):
        if not self.in_place:
            return await super().__acall__(request)  # type: ignore[misc]
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
    def __init__(self, get_response):
        super().__init__(get_response)
        if self.in_place:  # an async hook: the handler then calls it as it is, not through sync_to_async
            check = super().process_view

            async def process_view(request, callback, callback_args, callback_kwargs):
                return check(request, callback, callback_args, callback_kwargs)
            self.process_view = process_view

    def may_run_in_place(self) -> bool:
        return not settings.CSRF_USE_SESSIONS


class AuthenticationMiddleware(_OnLoop, auth.AuthenticationMiddleware):
    pass  # it only sets the lazy `request.user` and `request.auser`


class MessageMiddleware(_OnLoop, messages.MessageMiddleware):
    def blocks(self, request, response) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


# Each class here by its dotted path, to its Django base's (`__bases__[1]`, after `_OnLoop`).
DJANGO_PATHS = {f"{__name__}.{cls.__name__}": f"{cls.__bases__[1].__module__}.{cls.__bases__[1].__name__}"
                for cls in (SecurityMiddleware, SessionMiddleware, CommonMiddleware, CsrfViewMiddleware,
                            AuthenticationMiddleware, MessageMiddleware)}


@checks.register(checks.Tags.security, deploy=True)
def deploy_checks(app_configs, **kwargs):
    """Django's deploy checks that depend on these middlewares (HSTS, SSL
    redirect, nosniff, referrer and opener policies, Secure and HttpOnly
    cookies), run with MIDDLEWARE named as Django names it."""
    from django.core.checks.security import base
    from django.core.checks.security import csrf as csrf_checks
    from django.core.checks.security import sessions as session_checks
    from django.test.utils import override_settings

    named = [DJANGO_PATHS.get(path, path) for path in settings.MIDDLEWARE]
    found: list = []
    with override_settings(MIDDLEWARE=named):
        for check in (base.check_sts, base.check_sts_include_subdomains, base.check_sts_preload,
                      base.check_content_type_nosniff, base.check_ssl_redirect, base.check_referrer_policy,
                      base.check_cross_origin_opener_policy, csrf_checks.check_csrf_cookie_secure,
                      session_checks.check_session_cookie_secure, session_checks.check_session_cookie_httponly):
            found += check(app_configs)
    return found
