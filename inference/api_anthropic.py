"""`POST /v1/messages` and `/v1/messages/count_tokens`: the Anthropic
surface. Thin: translate, build on the shared chat path, submit, render.
Every error answers in Anthropic's shape."""
from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from ninja import Router

from inference.engine.errors import EngineError, PromptTooLong
from inference.protocols import anthropic, openai, params
from inference.protocols.errors import RequestError
from inference.runtime import runtime

log = logging.getLogger("hearth.api")
router = Router(tags=["anthropic"])


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse(anthropic.error_body(message, anthropic.error_type(status)), status=status)


async def _prepare(request: HttpRequest, counting: bool = False):
    engine = runtime.require_engine()
    body = await params.read_json_body(request.body)
    chat_body = anthropic.count_body(body) if counting else anthropic.to_chat_body(body)
    session = params.session_key(chat_body, request.headers)
    prepared = await openai.prepare_chat(chat_body, engine.loaded, runtime.defaults, runtime.grammar_enabled,
                                         runtime.templates)
    prepared.request.session = session
    return engine, body, prepared


def _guarded(view):
    async def run(request: HttpRequest) -> HttpResponse:
        try:
            return await view(request)
        except RequestError as exc:
            param = anthropic.PARAM_NAMES.get(exc.param or "", exc.param)
            message = exc.message.replace("stop must", "stop_sequences must") if param == "stop_sequences" \
                else exc.message
            return _error(exc.status, message)
        except PromptTooLong as exc:  # the message Claude Code reads to compact the conversation
            return _error(exc.status, f"prompt is too long: {exc.prompt_tokens} tokens > "
                                      f"{exc.max_prompt_tokens} maximum")
        except EngineError as exc:
            if exc.status >= 500:
                log.error("%s on %s: %s", type(exc).__name__, request.path, exc)
            return _error(exc.status, str(exc))
        except Exception as exc:
            log.exception("unhandled error on %s", request.path)
            return _error(500, str(exc) or type(exc).__name__)
    return run


@_guarded
async def _messages(request: HttpRequest) -> HttpResponse:
    engine, body, prepared = await _prepare(request)
    submission = engine.submit(prepared.request)
    reply = anthropic.Reply(engine.loaded.model_id, len(prepared.request.prompt_tokens))
    if body.get("stream"):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **prepared.headers}
        frames = anthropic.stream(reply, submission.events(), prepared.output, runtime.sse_keepalive)
        return StreamingHttpResponse(frames, content_type="text/event-stream", headers=headers)
    message, _, final = await openai.collect(submission.events(), prepared.output)
    if final.error is not None:
        return _error(final.error_status, final.error)
    return JsonResponse(reply.complete(message, final), headers=prepared.headers)


@_guarded
async def _count_tokens(request: HttpRequest) -> HttpResponse:
    _, _, prepared = await _prepare(request, counting=True)
    return JsonResponse({"input_tokens": len(prepared.request.prompt_tokens)})


@router.post("/messages")
async def messages(request: HttpRequest):
    return await _messages(request)


@router.post("/messages/count_tokens")
async def count_tokens(request: HttpRequest):
    return await _count_tokens(request)
