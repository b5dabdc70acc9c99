"""Errors raised while reading a request, rendered in the caller's shape."""
from __future__ import annotations


class RequestError(Exception):
    """A bad request: 400 unless said otherwise, naming the field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, kind, code

