"""`POST /v1/messages` and `/v1/messages/count_tokens`: the Anthropic
surface. Errors, raised or not, answer in Anthropic's shape (`errors.py`)."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from core.openapi import documented
from core.surfaces import ANTHROPIC
from inference.protocols import anthropic, anthropic_reply, inner_fields, unhonoured
from serving.routes import pipeline
from serving.routes.bodies import CountTokensRequest, MessagesRequest

router = ANTHROPIC.router(tags=["anthropic"])


@router.post("/messages", openapi_extra=documented(MessagesRequest))
async def messages(request: HttpRequest):
    body = await pipeline.read_body(request)
    inner = inner_fields.check(body, inner_fields.MESSAGES)
    engine, prepared = await pipeline.prepare_chat(request, anthropic.to_chat_body(body))
    pipeline.name_ignored(prepared, body, MessagesRequest, unhonoured.MESSAGES, "messages", inner)
    reply = anthropic_reply.Reply(engine.loaded_model.model_id, len(prepared.request.prompt_tokens))
    keepalive = request.runtime.options.sse_keepalive
    return await pipeline.respond(
        request, engine, prepared, "messages", bool(body.get("stream")),
        stream=lambda events: anthropic_reply.stream(reply, events, prepared.chat_output, keepalive,
                                               prepared.cached_tokens),
        complete=lambda message, logprobs, final: reply.complete(message, final))


@router.post("/messages/count_tokens", openapi_extra=documented(CountTokensRequest))
async def count_tokens(request: HttpRequest):
    body = await pipeline.read_body(request)
    inner = inner_fields.check(body, inner_fields.MESSAGES)
    _, prepared = await pipeline.prepare_chat(request, anthropic.count_body(body), None)
    # What a Messages request reads, count_tokens reads (or passes over: stream, max_tokens, tool_choice).
    pipeline.name_ignored(prepared, body, MessagesRequest, unhonoured.MESSAGES, "messages", inner)
    named = {k: v for k, v in prepared.headers.items() if k == pipeline.IGNORED_HEADER}  # no generation's Warning
    return JsonResponse({"input_tokens": len(prepared.request.prompt_tokens)}, headers=named)
