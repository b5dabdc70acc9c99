"""What a person is told when a request to the Hugging Face Hub fails: one
sentence to act on (the hub cannot be reached, or it answered with an
error), and the exception's own text as the `detail` shown under it.

Hub search (`/api/hub/search`) and downloads (`/downloads`) both answer
with these two, so the dashboard never shows a bare exception."""
from __future__ import annotations

import socket
import ssl
import urllib.error
from collections.abc import Iterator

import httpx

OFFLINE = "Hub search is off: HF_HUB_OFFLINE is set on this server."


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        yield at
        at = at.__cause__ or at.__context__


def _network(exc: BaseException) -> bool:
    """Whether `exc` says no answer came at all: a name that does not resolve, a refused or dropped
    connection, a timeout, a TLS failure (urllib and httpx spell these differently). A local file's
    OSError (a full disk) is none of these."""
    if isinstance(exc, urllib.error.HTTPError):
        return False  # an answer, with an error status
    return isinstance(exc, (urllib.error.URLError, httpx.TransportError, ConnectionError, TimeoutError,
                            socket.gaierror, ssl.SSLError))


def detail(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def failure(exc: BaseException) -> str | None:
    """The sentence for a request to the hub that failed with `exc`; None when `exc` is no network failure
    or error answer (the caller explains it)."""
    for cause in _chain(exc):
        if isinstance(cause, urllib.error.HTTPError):
            return f"The Hugging Face Hub ({endpoint()}) answered with an error (HTTP {cause.code})."
        status = getattr(getattr(cause, "response", None), "status_code", None)  # httpx's, or huggingface_hub's
        if isinstance(status, int) and status >= 400:  # own HTTP client's error (HfHubHTTPError), alike
            return f"The Hugging Face Hub ({endpoint()}) answered with an error (HTTP {status})."
        if _network(cause):
            return (f"The Hugging Face Hub cannot be reached from this server ({endpoint()}): check its network "
                    "connection, or HF_ENDPOINT.")
    return None
