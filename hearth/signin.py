"""The dashboard's sign-in: one form that asks for an API key once and keeps
the answer in a Django session (an HttpOnly, SameSite=Strict cookie), so
the pages and the chat socket need no key of their own; sign-out ends it.
`/auth` tells the dashboard whether a key is required and whether it is
signed in (it says nothing else, so it needs no key)."""
from __future__ import annotations

import asyncio
from html import escape

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.middleware.csrf import get_token
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from hearth import access

FAILED_SIGN_IN_DELAY_S = 0.5  # a wrong key costs the guesser time, not the server a thread

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark"><title>Hearth · Sign in</title>
<link rel="icon" href="/assets/icon.svg" type="image/svg+xml"><link rel="stylesheet" href="/assets/app.css">
</head><body class="signin">
<main id="main"><form class="card signin-card" method="post" action="/signin">
<h1><img src="/assets/icon.svg" alt="" width="26" height="26"> Hearth</h1>
<p class="muted">This server needs its API key. Enter it once; this browser stays signed in until you sign out.</p>
{error}
<label for="key">API key</label>
<input id="key" name="key" type="password" autocomplete="current-password" required autofocus>
<input type="hidden" name="next" value="{next}"><input type="hidden" name="csrfmiddlewaretoken" value="{csrf}">
<p><button class="primary" type="submit">Sign in</button></p>
<p class="hint">The key is what the server was started with (<code>--api-key</code>, <code>--api-key-file</code>
or <code>HEARTH_API_KEY</code>).</p>
</form></main>
<script>/* a redirect keeps the page's #route in the address; carry it through the sign-in */
const next = document.querySelector("[name=next]");
if (location.hash && !next.value.includes("#")) next.value += location.hash;</script>
</body></html>"""


def _safe_next(target: str | None) -> str:
    """Only a path on this server: never another site (`//host`, `https:`)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def _page(request: HttpRequest, next_path: str, error: str = "") -> HttpResponse:
    shown = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    html = PAGE.format(error=shown, next=escape(next_path), csrf=escape(get_token(request)))
    response = HttpResponse(html, content_type="text/html; charset=utf-8")
    response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "HEAD", "POST"])
async def signin(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        next_path = _safe_next(request.GET.get("next"))
        if not access.keys_required():
            return HttpResponseRedirect(next_path)
        return _page(request, next_path)
    next_path = _safe_next(request.POST.get("next"))
    if not access.keys_required():
        return HttpResponseRedirect(next_path)
    key = request.POST.get("key", "").strip()  # a pasted key often brings a newline
    if not access.key_accepted(key):
        await asyncio.sleep(FAILED_SIGN_IN_DELAY_S)
        return _page(request, next_path, "That key is not one this server accepts.")
    await request.session.acycle_key()  # a new session id: a planted cookie never becomes signed in
    await request.session.aset(access.SESSION_KEY, access.digest(key))
    return HttpResponseRedirect(next_path)


@csrf_exempt  # another site's POST carries no SameSite=Strict cookie, so it has nothing to end
@require_POST
async def signout(request: HttpRequest) -> HttpResponse:
    await request.session.aflush()
    wants_json = "application/json" in request.headers.get("Accept", "")
    if wants_json:
        return JsonResponse({"ok": True, "signedIn": False})
    return HttpResponseRedirect("/signin")


@require_safe
async def auth_state(request: HttpRequest) -> JsonResponse:
    signed_in = access.keys_required() and await access.request_signed_in(request)
    return JsonResponse({"keyRequired": access.keys_required(), "signedIn": signed_in})
