"""`POST /v1/chat/completions` and `POST /v1/completions`."""
from __future__ import annotations

from django.http import HttpRequest

from core.openapi import documented
from core.surfaces import OPENAI
from inference.protocols import chat, inner_fields, openai_reply, unhonoured
from serving.routes import pipeline
from serving.routes.audio import audio_parts_to_text
from serving.routes.bodies import ChatCompletionRequest, CompletionRequest

router = OPENAI.router(tags=["openai"])


async def _generate(request: HttpRequest, kind: str):
    runtime = request.runtime
    body = await pipeline.read_body(request)
    inner = inner_fields.check(body, inner_fields.CHAT if kind == "chat" else inner_fields.COMPLETIONS)
    if kind == "chat":
        chat.media_in_user_messages(body.get("messages"))  # before a part is transcribed or decoded
        await audio_parts_to_text(request, body)  # transcribed by the Whisper model (no chat model hears)
    openai_reply.usage_apart(body)  # a bad stream_options is refused before the prompt is built
    prepare = pipeline.prepare_chat if kind == "chat" else pipeline.prepare_completion
    engine, prepared = await prepare(request, body)
    if kind == "chat":
        pipeline.name_ignored(prepared, body, ChatCompletionRequest, unhonoured.CHAT, inner=inner)
    else:
        pipeline.name_ignored(prepared, body, CompletionRequest, unhonoured.COMPLETIONS, inner=inner)
    reply = openai_reply.Reply(kind, engine.loaded_model.model_id, body)
    param, streaming = "messages" if kind == "chat" else "prompt", bool(body.get("stream"))
    if prepared.n > 1:
        return await pipeline.respond_choices(request, engine, prepared, param, streaming, reply,
                                              runtime.options.sse_keepalive)
    return await pipeline.respond(
        request, engine, prepared, param, streaming,
        stream=lambda events: openai_reply.stream(reply, events, prepared.output, runtime.options.sse_keepalive),
        complete=lambda message, logprobs, final: reply.complete(message, final.finish_reason, final.final_usage,
                                                                 logprobs))


@router.post("/chat/completions", openapi_extra=documented(ChatCompletionRequest))
async def chat_completions(request: HttpRequest):
    return await _generate(request, "chat")


@router.post("/completions", openapi_extra=documented(CompletionRequest))
async def completions(request: HttpRequest):
    return await _generate(request, "completion")
