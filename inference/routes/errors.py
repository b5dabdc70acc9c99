"""Every `/v1` error in its caller's protocol, from one place: Anthropic's
shape on `/v1/messages*`, OpenAI's everywhere else. The `/v1` API's
exception handlers call `render`; routes only raise."""
from __future__ import annotations

import logging

from django.http import JsonResponse

from core.http import error_object, is_anthropic
from inference.engine.errors import EngineError, PromptTooLong
from inference.protocols.errors import RequestError

log = logging.getLogger("hearth.api")


def render(path: str, status: int, message: str, kind: str | None = None, param: str | None = None,
           code: str | None = None) -> JsonResponse:
    return JsonResponse(error_object(path, status, message, code, kind, param), status=status)


def request_error(path: str, exc: RequestError) -> JsonResponse:
    return render(path, exc.status, exc.message, exc.type, exc.param, exc.code)


def engine_error(path: str, exc: EngineError) -> JsonResponse:
    if exc.status >= 500:
        log.error("%s on %s: %s", type(exc).__name__, path, exc)
    if isinstance(exc, PromptTooLong) and is_anthropic(path):  # the message Claude Code reads to compact
        return render(path, exc.status, f"prompt is too long: {exc.prompt_tokens} tokens > "
                                        f"{exc.max_prompt_tokens} maximum")
    return render(path, exc.status, str(exc), exc.type, exc.param, exc.code)


def unexpected(path: str, exc: Exception) -> JsonResponse:
    log.error("unhandled error on %s", path, exc_info=exc)
    return render(path, 500, str(exc) or type(exc).__name__, "server_error")
