"""Errors raised while reading a request, rendered in the caller's shape."""
from __future__ import annotations


class RequestError(Exception):
    """A bad request: 400 unless said otherwise, naming the field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, kind, code


def openai_error(message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> dict:
    """The OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def failure(status: int, message: str, param: str | None = None) -> dict:
    """The OpenAI body for a generation that failed with `status`."""
    return openai_error(message, "server_error" if status >= 500 else "invalid_request_error", param)
