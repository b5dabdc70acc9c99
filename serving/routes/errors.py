"""Every `/v1` error in its caller's protocol, from one place: the request's
surface (`core.surfaces`) shapes the body. The `/v1` API's exception
handlers call these; routes only raise."""
from __future__ import annotations

import logging

from django.http import JsonResponse

from core.surfaces import ANTHROPIC, Surface
from inference.engine.errors import EngineError, PromptTooLong
from inference.protocols.errors import RequestError

log = logging.getLogger("hearth.api")


def render(surface: Surface, status: int, message: str, kind: str | None = None, param: str | None = None,
           code: str | None = None) -> JsonResponse:
    return surface.response(status, message, code, kind, param)


def request_error(surface: Surface, exc: RequestError) -> JsonResponse:
    return render(surface, exc.status, exc.message, exc.type, exc.param, exc.code)


def engine_error(surface: Surface, exc: EngineError) -> JsonResponse:
    if exc.status == 503:  # not now (a model loading, training or draining), not a fault
        log.info("%s: %s", type(exc).__name__, exc)
    elif exc.status >= 500:
        log.error("%s: %s", type(exc).__name__, exc)
    if isinstance(exc, PromptTooLong) and surface is ANTHROPIC:  # the message Claude Code reads to compact
        return render(surface, exc.status, f"prompt is too long: {exc.prompt_tokens} tokens > "
                                           f"{exc.max_prompt_tokens} maximum")
    return render(surface, exc.status, str(exc), exc.type, exc.param, exc.code)


def unexpected(surface: Surface, exc: Exception, path: str) -> JsonResponse:
    log.error("unhandled error on %s", path, exc_info=exc)
    return render(surface, 500, str(exc) or type(exc).__name__, "server_error")
