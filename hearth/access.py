"""Who may use this server: API keys, the dashboard's signed-in session,
the Host names it answers to, and the origins allowed cross-origin.

Rules:
- With no key configured every request passes (the bind policy in `hearth
  serve` allows that only on loopback, or with --insecure-no-auth).
- With keys, every route needs one except the few in PUBLIC (health and
  the sign-in page): a route added later is covered without being listed
  anywhere. The one other exception is the CORS preflight (OPTIONS) of the
  two routes that answer any origin. The static files (the dashboard's
  modules, styles and vendored libraries, which the sign-in page is drawn
  with too, and the admin's) are public: WhiteNoise serves them beside
  Django (hearth/static.py), after the Host check only.
- A key is accepted as `Authorization: Bearer KEY` or `x-api-key: KEY`, or
  through the session cookie the sign-in page sets. Keys are compared as
  SHA-256 digests with `hmac.compare_digest`, against every key, so neither
  timing nor length tells how close a guess was.
- A session remembers the digest of the key it signed in with: removing a
  key from the configuration signs its sessions out.
- What a request makes that can be fetched again later by id (a resumable
  stream, a stored Response) belongs to the key it came with: its *holder*,
  a one-way name of that key (core/holders.py). Another key gets a 404 for it.
  A router (and a web node passing a request to another) states the holder
  of a request it forwards in `X-Hearth-Holder`; only a request that
  authenticated with one of `runtime.hop_keys` may state it.
"""
from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

from core import holders
from hearth.root import RUNTIME as runtime

SESSION_KEY = "hearth_key"
# Reachable without a key: health checks, and the sign-in page.
PUBLIC = ("/health", "/signin", "/signout", "/auth")
# Routes that answer any origin (the Curve Designer's): a browser's preflight never carries a key,
# so their OPTIONS passes unchecked (it does nothing but state the CORS headers); POST needs the key.
OPEN_PREFLIGHT = ("/signal", "/generate", "/curve-terrain/surface")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys_required() -> bool:
    return bool(runtime.api_keys)


def _digest_configured(wanted: str) -> bool:
    """Whether `wanted` is the digest of a configured key, compared with
    every key in constant time."""
    found = False
    for key in runtime.api_keys:
        found |= hmac.compare_digest(wanted, digest(key))
    return found


def key_accepted(candidate: str | None) -> bool:
    """Whether `candidate` is one of the configured keys."""
    if not candidate:
        return False
    return _digest_configured(digest(candidate))


def session_signed_in(session) -> bool:
    """Whether a Django session was signed in with a key that is still configured."""
    held = session.get(SESSION_KEY) if session is not None else None
    return isinstance(held, str) and _digest_configured(held)


async def request_signed_in(request) -> bool:
    """Whether this request carries a signed-in dashboard session."""
    from django.conf import settings

    if not request.COOKIES.get(settings.SESSION_COOKIE_NAME):
        return False
    return session_signed_in({SESSION_KEY: await request.session.aget(SESSION_KEY)})


def holder(key: str | None, session_digest: str | None, stated: str | None) -> str:
    """The holder (core/holders.py) of a request that passed the key check:
    the key's, the signed-in session's, or the one a hop states (a request
    made with a hop key); "" when no key is required."""
    if not keys_required():
        return ""
    if key:
        hop = False
        for hop_key in runtime.hop_keys:  # constant time against every hop key
            hop |= hmac.compare_digest(digest(key), digest(hop_key))
        if hop and stated is not None:
            return stated if holders.well_formed(stated) else ""
        return holders.holder_of(digest(key))
    return holders.holder_of(session_digest) if session_digest else ""


def presented_key(headers) -> str | None:
    """The key a client sent: `Authorization: Bearer KEY` or `x-api-key: KEY`."""
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return (headers.get("x-api-key") or "").strip() or None


def is_public(path: str, method: str = "GET") -> bool:
    if method == "OPTIONS" and path in OPEN_PREFLIGHT:
        return True
    return path in PUBLIC


def _hostname(authority: str) -> str | None:
    """The host name of `host[:port]`, lowercased; None when it does not parse."""
    try:
        return urlsplit(f"//{authority}").hostname or ""
    except ValueError:  # "[", a bad IPv6 literal, a bad port
        return None


def host_allowed(host: str) -> bool:
    """Whether a request's Host names this server (the names `hearth serve`
    admits: hearth/access_settings.py). Refusing other names stops a
    DNS-rebinding page, whose Origin and Host agree, from reaching the API
    through the user's browser."""
    name = _hostname(host)
    if name is None:
        return False
    allowed = runtime.allowed_hosts
    return allowed is None or name in allowed


def refused_host(host: str) -> str:
    """Why a request for a Host name `host_allowed` refuses is refused."""
    return f"requests for host {host!r} are refused (not this server's name)"


def cross_origin(origin: str | None, host: str) -> bool:
    """Whether a request comes from a page on another origin than this
    server's (`Origin` names another host[:port], is `null`, or does not
    parse). No `Origin` (SDK clients, same-origin GETs) is not cross-origin."""
    if origin is None:
        return False
    try:
        return origin == "null" or urlsplit(origin).netloc != host
    except ValueError:
        return True


def origin_allowed(origin: str | None) -> bool:
    """Whether the operator allowed this origin cross-origin (`--cors-origin`)."""
    if not origin:
        return False
    return origin.rstrip("/").lower() in runtime.cors_origins
