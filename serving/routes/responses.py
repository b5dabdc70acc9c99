"""`/v1/responses`: the OpenAI Responses surface, with stored turns for
`previous_response_id` and `item_reference`, and a stored turn's input
items listed; each stored turn is its API key's."""
from __future__ import annotations

import asyncio

from django.http import HttpRequest, HttpResponse, JsonResponse

from core import holders
from core.openapi import documented
from core.surfaces import RESPONSES
from inference.protocols import inner_fields, responses, responses_reply, unhonoured
from inference.protocols.errors import RequestError
from serving.routes import pipeline
from serving.routes.bodies import ResponsesRequest

router = RESPONSES.router(tags=["responses"])


def _not_found(response_id: str) -> RequestError:
    return RequestError(f"Response with id '{response_id}' not found (unknown or expired)", status=404,
                        code="response_not_found")


@router.post("/responses", openapi_extra=documented(ResponsesRequest))
async def create(request: HttpRequest) -> HttpResponse:
    store_them = request.runtime.responses
    body = await pipeline.read_body(request)
    inner = inner_fields.check(body, inner_fields.RESPONSES)
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise RequestError("store must be a boolean", "store")
    holder = holders.of(request)  # what this request stores is its key's (core/holders.py)
    # Off the loop: a previous_response_id and each item_reference read the store (a file, Redis).
    turn = await asyncio.to_thread(responses.Turn, body, store_them, holder,
                                   request.runtime.options.limits.max_messages)
    engine, prepared = await pipeline.prepare_chat(request, turn.chat_body(body), "input")
    pipeline.name_ignored(prepared, body, ResponsesRequest, unhonoured.RESPONSES, "responses", inner)
    model = engine.loaded_model
    reply = responses_reply.Reply(model.model_id, body, turn, model.tokenizer)

    async def keep(message, response: dict) -> None:
        if store:  # off the loop: a turn may be megabytes of JSON, written to a file or Redis
            await asyncio.to_thread(store_them.put, response, turn.messages, responses_reply.chat_output(message),
                                    turn.instructions, turn.system, holder, turn.input_items)

    async def complete(message, logprobs, final) -> dict:
        response = reply.complete(message, final)
        await keep(message, response)
        return response

    keepalive = request.runtime.options.sse_keepalive
    return await pipeline.respond(
        request, engine, prepared, "input", bool(body.get("stream")),
        stream=lambda events: responses_reply.stream(reply, events, prepared.chat_output, keepalive, keep),
        complete=complete)


@router.get("/responses/{response_id}")
def retrieve(request: HttpRequest, response_id: str) -> HttpResponse:
    stored = request.runtime.responses.get(response_id, holders.of(request))
    if stored is None:
        raise _not_found(response_id)
    return JsonResponse(stored.response)


@router.delete("/responses/{response_id}")
def delete(request: HttpRequest, response_id: str) -> HttpResponse:
    if not request.runtime.responses.delete(response_id, holders.of(request)):
        raise _not_found(response_id)
    return JsonResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/responses/{response_id}/input_items")
def input_items(request: HttpRequest, response_id: str) -> HttpResponse:
    """A stored response's input items (`item_reference` finds them by these ids), newest first unless
    `order=asc`, `limit` (1 to 100, 20) at a time, after the item `after`."""
    query = request.GET
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise RequestError("order must be asc or desc", "order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise RequestError("limit must be an integer from 1 to 100", "limit")
    for value in query.getlist("include") + query.getlist("include[]"):
        if value != "message.input_image.image_url":  # input images are listed as they were sent
            raise RequestError(f"include {value!r} is not supported here: input items are listed as they were "
                               "sent, and nothing else is kept", "include", code="unsupported_parameter")
    stored = request.runtime.responses.get(response_id, holders.of(request))
    if stored is None:
        raise _not_found(response_id)
    items = stored.input if order == "asc" else stored.input[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise RequestError(f"after: no input item '{after}' in response '{response_id}'", "after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return JsonResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})
