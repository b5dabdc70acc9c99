"""`/v1/responses`: the OpenAI Responses surface, with stored turns for
`previous_response_id`. Thin: translate, build on the shared chat path,
submit, render. Errors use the OpenAI shape (the /v1 handlers)."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from ninja import Router

from inference.api import submit
from inference.protocols import openai, params, responses
from inference.protocols.errors import RequestError, openai_error
from inference.runtime import runtime

router = Router(tags=["responses"])


def _not_found(response_id: str) -> JsonResponse:
    return JsonResponse(openai_error(f"Response with id '{response_id}' not found (unknown or expired)",
                                     code="response_not_found"), status=404)


@router.post("/responses")
async def create(request: HttpRequest) -> HttpResponse:
    engine = runtime.require_engine()
    body = await params.read_json_body(request.body)
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise RequestError("store must be a boolean", "store")
    turn = responses.Turn(body, runtime.responses)
    chat_body = turn.chat_body(body)
    session = params.session_key(chat_body, request.headers)
    prepared = await openai.prepare_chat(chat_body, engine.loaded, runtime.defaults, runtime.grammar_enabled,
                                         runtime.templates)
    prepared.request.session = session
    submission = submit(engine, prepared.request, "input")
    reply = responses.Reply(engine.loaded.model_id, body, turn, engine.loaded.tokenizer)

    def keep(message, response: dict) -> None:
        if store:
            runtime.responses.put(response, turn.messages, responses.chat_output(message), turn.instructions,
                                  turn.system)

    if body.get("stream"):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **prepared.headers}
        frames = responses.stream(reply, submission.events(), prepared.output, runtime.sse_keepalive, keep)
        return StreamingHttpResponse(frames, content_type="text/event-stream", headers=headers)
    message, _, final = await openai.collect(submission.events(), prepared.output)
    if final.error is not None:
        kind = "server_error" if final.error_status >= 500 else "invalid_request_error"
        return JsonResponse(openai_error(final.error, kind, final.error_param), status=final.error_status)
    response = reply.complete(message, final)
    keep(message, response)
    return JsonResponse(response, headers=prepared.headers)


@router.get("/responses/{response_id}")
def retrieve(request: HttpRequest, response_id: str) -> HttpResponse:
    stored = runtime.responses.get(response_id)
    return JsonResponse(stored.response) if stored is not None else _not_found(response_id)


@router.delete("/responses/{response_id}")
def delete(request: HttpRequest, response_id: str) -> HttpResponse:
    if not runtime.responses.delete(response_id):
        return _not_found(response_id)
    return JsonResponse({"id": response_id, "object": "response", "deleted": True})
