"""The one generation pipeline every protocol route runs: prepare the chat
turn (or the raw prompt), submit it, then stream the protocol's frames or
collect the reply and render it. The protocol module says how to read its
body and how to render; nothing else differs between the surfaces."""
from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable

from django.http import HttpResponse, JsonResponse

from core import holders, surfaces
from inference.engine.engine import Engine
from inference.engine.errors import ContextLengthExceeded
from inference.engine.rows import Submission
from inference.engine.types import EventStream, GenerationEvent, GenerationRequest
from inference.protocols import choices, openai, openai_reply, params, unhonoured
from inference.protocols.errors import RequestError
from inference.protocols.openai import Prepared
from inference.protocols.output import Message
from serving import traces
from serving.streams.store import StreamRefused, check_id, close_quietly, request_key


def submit(engine: Engine, request: GenerationRequest, param: str) -> Submission:
    """`engine.submit`, naming the request field (`messages`, `prompt`,
    `input`) a prompt too long for the model's window comes from. It raises
    before a streaming reply starts, so every refusal is a plain HTTP error."""
    try:
        return engine.submit(request)
    except ContextLengthExceeded as exc:
        exc.param = param
        raise


IGNORED_HEADER = "X-Hearth-Ignored-Fields"


def name_ignored(prepared: Prepared, body: dict, schema, table: dict, surface: str = "",
                 inner: list[str] | None = None) -> None:
    """Name in a header the body's fields nothing reads (the route's schema
    lists what is read; `table` what passed because it asked for nothing),
    the keys inside its objects nothing reads (`inner`, from
    inner_fields.check), and the built-in tools of a Responses or Messages
    request, which never run."""
    fields = unhonoured.ignored(body, schema.model_fields, table) + (inner or [])
    if surface:
        fields += unhonoured.dropped_tools(body, surface)
    if fields:
        prepared.headers[IGNORED_HEADER] = unhonoured.header_value(fields)


async def read_body(request) -> dict:
    """The request's JSON object, within the runtime's bounds."""
    return await params.read_json_body(request.body, request.runtime.options.limits.max_json_depth)


async def prepare_chat(request, chat_body: dict, param: str | None = "messages") -> tuple[Engine, Prepared]:
    """The chat turn a protocol's body stands for, on the runtime's engine. A
    prompt the engine would refuse as too long is refused as soon as it is
    built, before any grammar compiles, naming `param` (None: not refused,
    for a count of its tokens)."""
    runtime = request.runtime
    engine = runtime.require_engine(chat_body.get("model"))
    session = params.session_key(chat_body, request.headers)
    prepared = await openai.prepare_chat(chat_body, engine.loaded_model, runtime.options,
                                         _room(engine, param) if param is not None else None)
    prepared.request.session = session
    return engine, prepared


def _room(engine: Engine, param: str) -> Callable[[int], None]:
    """The engine's refusal of a prompt of n tokens too long for it, naming `param`."""
    def room(n: int) -> None:
        try:
            engine.check_room(n)
        except ContextLengthExceeded as exc:
            exc.param = param
            raise
    return room


async def prepare_completion(request, body: dict) -> tuple[Engine, Prepared]:
    """The raw-prompt completion a body stands for, on the runtime's engine; a prompt too long for it is
    refused before its grammar compiles."""
    runtime = request.runtime
    engine = runtime.require_engine(body.get("model"))
    prepared = await openai.prepare_completion(body, engine.loaded_model, runtime.options, _room(engine, "prompt"))
    prepared.request.session = params.session_key(body, request.headers)
    return engine, prepared


async def respond(request, engine: Engine, prepared: Prepared, param: str, streaming: bool, *,
                  stream: Callable[[EventStream], AsyncIterator[bytes]],
                  complete: Callable[[Message, list[dict], GenerationEvent], dict | Awaitable[dict]]) -> HttpResponse:
    """Submit, then stream `stream(events)` as SSE, or collect the reply and
    answer `complete(message, logprobs, final)`, or the route's error shape
    for a generation that failed."""
    conversation = conversation_id(request) if streaming else None
    submission = prepared.submission = submit(engine, prepared.request, param)
    events = traces.observed(request, prepared, submission.events())
    if streaming:
        frames = stream(events)
        headers = dict(prepared.headers)
        if conversation is not None:  # the generation runs to its end whoever reads; replayable
            frames = await resumable(request, conversation, engine.loaded_model.model_id, frames, submission)
            headers["X-Conversation-Id"] = conversation
        return surfaces.of(request).sse(frames, headers)
    message, logprobs, final = await openai_reply.collect(events, prepared.output)
    if final.error is not None:
        status = final.error_status
        return surfaces.of(request).response(status, final.error, param=final.error_param)
    answer = complete(message, logprobs, final)
    if inspect.isawaitable(answer):  # a route that stores what it answered (Responses) does so off the loop
        answer = await answer
    return JsonResponse(answer, headers=prepared.headers)


async def respond_choices(request, engine: Engine, prepared: Prepared, param: str, streaming: bool,
                          reply: openai_reply.Reply, keepalive: float) -> HttpResponse:
    """`respond` for a chat or completion that asks for `n` > 1 choices: each
    a row of the batch, submitted together (protocols/choices.py)."""
    conversation = conversation_id(request) if streaming else None
    runs = choices.requests(prepared, engine.loaded_model.grammar_compiler)
    submitted: list[Submission] = []
    try:
        for generation, _ in runs:
            submitted.append(submit(engine, generation, param))
    except BaseException:
        for submission in submitted:
            submission.abort()
        raise
    prepared.submission = submitted[0]
    events = [(traces.observed(request, prepared, submission.events()), output)
              for submission, (_, output) in zip(submitted, runs, strict=True)]
    if streaming:
        frames = choices.stream(reply, events, keepalive)
        headers = dict(prepared.headers)
        if conversation is not None:
            frames = await resumable(request, conversation, engine.loaded_model.model_id, frames, _All(submitted))
            headers["X-Conversation-Id"] = conversation
        return surfaces.of(request).sse(frames, headers)
    answer, failed = await choices.complete(reply, events)
    if failed is not None:
        return surfaces.of(request).response(failed.error_status, failed.error or "", param=failed.error_param)
    return JsonResponse(answer, headers=prepared.headers)


class _All:
    """Several submissions stopped or aborted as one."""

    def __init__(self, submissions: list[Submission]):
        self.submissions = submissions

    def stop(self) -> None:
        for submission in self.submissions:
            submission.stop()

    def abort(self) -> None:
        for submission in self.submissions:
            submission.abort()


def conversation_id(request) -> str | None:
    """The request's `X-Conversation-Id` (None: absent or empty), checked."""
    value = request.headers.get("X-Conversation-Id", "").strip()
    if not value:
        return None
    try:
        return check_id(value)
    except StreamRefused as exc:
        raise RequestError(exc.message, "X-Conversation-Id") from None


def replay_key(request) -> str:
    """The request's `store.request_key`: what an identical retry of it shares (worked out once)."""
    key = getattr(request, "hearth_replay_key", None)
    if key is None:
        key = request.hearth_replay_key = request_key(request.path, request.body, holders.of(request))
    return key


async def resumable(request, conversation: str, model: str, frames: AsyncIterator[bytes],
                    submission: Submission | _All) -> AsyncIterator[bytes]:
    """Hand `frames` to the runtime's resumable streams; the reply follows them."""
    surface = surfaces.of(request)

    async def stop() -> None:
        submission.stop()

    try:
        return await request.runtime.streams.start(conversation, surface.name, model, frames, stop,
                                                   surface.stream_error,
                                                   holder=holders.of(request), request=replay_key(request))
    except StreamRefused as exc:
        submission.abort()
        await close_quietly(frames)
        raise RequestError(exc.message, exc.param, status=exc.status,
                           kind="server_error" if exc.status >= 500 else "invalid_request_error") from None
    except BaseException:  # the client left while an earlier generation stopped: this one goes too
        submission.abort()
        await close_quietly(frames)
        raise
