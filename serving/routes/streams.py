"""Resumable streams (`serving/streams/`): `GET /v1/stream/{id}?from=N`
replays a conversation's stream from byte N and follows it live,
`DELETE /v1/stream/{id}` stops its generation, `POST /v1/streams/lookup`
says which of the ids a client names are live or replayable (never any
other: a conversation id is as good as a password, so there is no listing).
With several API keys a stream is its key's (core/holders.py): another key
is answered as if it did not exist.

With Redis these reach every web node's streams (`serving/streams/shared.py`).
In router mode these run in the router, which records every stream itself;
a stop goes on to the model's process that generates."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from ninja import Query, Schema
from pydantic import Field

from core import holders, surfaces
from core.surfaces import OPENAI
from inference.protocols.errors import RequestError
from serving.streams.store import MAX_LOOKUP, Gone, StreamRefused, check_id

router = OPENAI.router(tags=["streams"])


class LookupRequest(Schema):
    conversation_ids: list[str] = Field(..., max_length=MAX_LOOKUP,
                                        description="the conversations to ask about (at most 1000)")


def _id(conversation_id: str) -> str:
    try:
        return check_id(conversation_id, "conversation id")
    except StreamRefused as exc:
        raise RequestError(exc.message, "conversation_id") from None


def _unknown(conversation_id: str) -> RequestError:
    return RequestError(f"no stream for conversation {conversation_id!r} (unknown, or ended more than the "
                        "stream TTL ago)", "conversation_id", status=404, code="stream_not_found")


@router.get("/stream/{conversation_id}")
async def replay(request: HttpRequest, conversation_id: str, offset: int = Query(0, alias="from")):
    """The stream's bytes from byte `from` (default 0), then live until it ends.
    Headers: `X-Stream-Status` (live or how it ended), `X-Stream-Start` (the
    first byte still kept), `X-Stream-Bytes` (its length so far). A stream
    whose server died mid-generation, asked from past where its closing error
    event begins (but for its very end), answers that event alone."""
    conversation_id = _id(conversation_id)
    streams = request.runtime.streams
    stream = await streams.find(conversation_id, holders.of(request))  # with Redis, another web node's too
    if stream is None:
        raise _unknown(conversation_id)
    if offset < 0:
        raise RequestError("from must be a byte offset, 0 or more", "from")
    headers = {"X-Conversation-Id": conversation_id, "X-Stream-Status": stream.meta.state,
               "X-Stream-Start": str(stream.start), "X-Stream-Bytes": str(stream.end)}
    crashed = stream.after_crash(offset)
    if crashed is not None:  # the client got bytes the disk never did: the event that says why it ended
        return surfaces.of(request).sse(crashed, headers)
    try:
        stream.check_offset(offset)
    except Gone as exc:
        raise RequestError(str(exc), "from", status=410, code="stream_bytes_gone") from None
    except ValueError as exc:
        raise RequestError(str(exc), "from", status=416, code="stream_offset_past_end") from None
    return surfaces.of(request).sse(stream.follow(offset), headers)


@router.delete("/stream/{conversation_id}")
async def stop(request: HttpRequest, conversation_id: str):
    """Stop the conversation's generation (within a decode step) and answer
    once its stream has ended; a stream already ended is left as it is."""
    conversation_id = _id(conversation_id)
    streams = request.runtime.streams
    relayed = conversation_id in streams.relayed  # a router's generation in this model's process
    holder = holders.of(request)
    known = await streams.find(conversation_id, holder)
    was_live = relayed or (known is not None and known.live)
    stream = await streams.stop(conversation_id, holder=holder)
    if stream is None and not relayed:
        raise _unknown(conversation_id)
    body = stream.meta.public() if stream is not None else {"conversation_id": conversation_id,
                                                             "status": "stopped"}
    return JsonResponse({**body, "stopped": was_live})


@router.post("/streams/lookup")
async def lookup(request: HttpRequest, body: LookupRequest):
    """Which of `conversation_ids` have a live or replayable stream, with their lengths."""
    try:
        found = await request.runtime.streams.lookup(body.conversation_ids, holders.of(request))
    except StreamRefused as exc:
        raise RequestError(exc.message, exc.param) from None
    return JsonResponse({"object": "list", "data": found})
