"""The one error type of `/api` (the dashboard API) and its answer:
`{"ok": false, "error": message}` with its status.

Routes raise `ApiError`; the `/api` exception handler (hearth/api.py)
renders it with `answer`, and renders ninja's own errors and anything
unexpected the same way. Extra fields an error carries (snake_case, such as
memory's `enabled` and `root`) sit beside `error`.

Uses Django (its response type), as core/db.py does; the engine never
imports either. No imports of the project's apps."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.http import HttpRequest, JsonResponse

from core import jsonbody, limits
from core.surfaces import API


class ApiError(Exception):
    """A refusal on `/api`: its message, HTTP status and any fields shown beside it."""

    def __init__(self, message: str, status: int = 400, **fields: object) -> None:
        super().__init__(message)
        self.message, self.status, self.fields = message, status, fields


def answer(exc: ApiError) -> JsonResponse:
    """The `/api` answer for `exc` (its shape is `core.surfaces.API`'s)."""
    return JsonResponse(API.error(exc.status, exc.message, **exc.fields), status=exc.status)


@contextmanager
def refused(*errors: type[Exception], status: int = 400) -> Iterator[None]:
    """Any of `errors` raised inside becomes an ApiError with its message and `status`."""
    try:
        yield
    except errors as exc:
        raise ApiError(str(exc), status) from None


def json_body(request: HttpRequest) -> dict:
    """The request's JSON object (an empty body reads as `{}`); ApiError (400) says why not."""
    try:
        return jsonbody.load_object(request.body or b"{}", limits.current().max_json_depth)
    except jsonbody.JsonRefused as exc:
        raise ApiError(str(exc)) from None

