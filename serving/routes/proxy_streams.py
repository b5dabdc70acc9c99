"""Router mode's resumable streams: a streaming POST with `X-Conversation-Id`
forwarded to a model's process (serving/routes/proxy.py), its stream
recorded by the router itself (serving/streams/store.py), so it outlives
the client. The model's process only keeps the generation stoppable, under
a name of its own (`token`).

Rules, as in one process:
- The conversation's live stream is stopped once this request's stream has
  begun (`Streams.start`), never by a request that is refused: an unknown
  model, a body the model's process rejects, a load that fails. The one
  exception is a load that has to wait for room while every loaded model is
  busy: the conversation's own generation may be what holds it, so it is
  stopped then (`make_way`).
- The generation does not depend on the connection from the moment it is
  asked for: a client that leaves while its model loads (or before the
  model's process answers) leaves a stream that runs on (`_adopt`): the
  load goes on, the generation follows, a resume gets the bytes. When the
  conversation has no live stream, it is recorded at once (a resume finds
  it while the model loads), and a load that fails ends it with an error
  event in the route's protocol, `failed`. When it has one, nothing is
  recorded until the model's process has begun: a load that fails then
  leaves the running stream alone. A client that leaves while an earlier
  generation is being stopped for its stream leaves it recorded all the
  same (`_record`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from core import holders, surfaces
from serving.router.manager import MakeWay, Manager
from serving.router.slots import RouterError
from serving.routes import errors
from serving.routes.pipeline import replay_key
from serving.streams.store import StreamRefused, close_quietly

if TYPE_CHECKING:
    from serving.routes.proxy import Opened

log = logging.getLogger("hearth.router")

OpenFn = Callable[[str, MakeWay], Awaitable["HttpResponse | Opened"]]


async def forward(request: HttpRequest, manager: Manager, conversation: str, named: str | None,
                  open_fn: OpenFn) -> HttpResponse:
    """Open the model's stream (`open_fn(token, make_way)`) and record it as
    the conversation's; a refusal is answered as it came."""
    surface = surfaces.for_path(request.path)
    streams = request.runtime.streams
    holder = holders.of(request)
    adopted: list[bool] = []

    async def make_way() -> None:  # the load waits for room: this conversation's generation may hold it
        if not adopted:  # once adopted, this request's stream is the conversation's: nothing else runs
            await streams.stop(conversation, holder=holder)

    opening = asyncio.ensure_future(open_fn(f"router-{secrets.token_hex(12)}", make_way))
    try:
        opened = await asyncio.shield(opening)
    except asyncio.CancelledError:  # the client left before the model's process answered
        adopted.append(True)
        request.hearth_kept = True  # read by the request log
        _adopt(request, manager, conversation, named, opening)
        raise
    except RouterError as exc:
        return errors.engine_error(surface, exc)
    if isinstance(opened, HttpResponse):
        return opened  # refused before it began: the conversation's stream runs on
    return await _record(request, conversation, opened)


_kept: set[asyncio.Task] = set()  # the streams of clients that left, while they are being recorded


def _keep(coroutine) -> None:
    task = asyncio.ensure_future(coroutine)
    _kept.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_kept.discard)


async def _start(request: HttpRequest, conversation: str, opened: Opened) -> AsyncIterator[bytes]:
    """The model's stream, begun, recorded as the conversation's (the one
    before it stops now): what its reader gets from the first byte. A
    stream refused (or never recorded) closes the model's."""
    surface = surfaces.for_path(request.path)
    chunks = opened.relay.__aiter__()
    try:
        return await request.runtime.streams.start(conversation, surface.name, opened.slot.id, chunks, opened.stop,
                                                   surface.stream_error, failed=lambda: opened.relay.broke,
                                                   holder=holders.of(request), request=replay_key(request))
    except BaseException:
        await close_quietly(chunks)
        opened.relay.close()
        raise


async def _unread(starting: asyncio.Future) -> None:
    """A stream recorded for a client that left: the store runs it; its reader is let go."""
    try:
        frames = await starting
    except (asyncio.CancelledError, Exception):
        return  # refused: the model's stream is closed
    await close_quietly(frames)


async def _record(request: HttpRequest, conversation: str, opened: Opened) -> HttpResponse:
    """`_start`, answered to the client; one that leaves while the earlier
    generation stops (up to 10 s) leaves its stream recorded all the same."""
    surface = surfaces.for_path(request.path)
    starting = asyncio.ensure_future(_start(request, conversation, opened))
    try:
        frames = await asyncio.shield(starting)
    except asyncio.CancelledError:
        _keep(_unread(starting))
        raise
    except StreamRefused as exc:
        return errors.render(surface, exc.status, exc.message, param=exc.param)
    return StreamingHttpResponse(frames, status=opened.status,
                                 headers={**opened.headers, "X-Conversation-Id": conversation})


def _adopt(request: HttpRequest, manager: Manager, conversation: str, named: str | None,
           opening: asyncio.Task) -> None:
    """The client left while `opening` (the load, then the request to the
    model's process) was under way: the stream is recorded now when the
    conversation has no live one, else once the model's process has begun
    it, and takes whatever `opening` brings."""
    streams = request.runtime.streams
    running = streams.get(conversation)
    if running is not None and running.live:
        log.info("conversation %s: its client left before the model answered; its stream is recorded once "
                 "it begins", conversation)
        _keep(_begun(request, conversation, opening))
        return
    surface = surfaces.for_path(request.path)
    called_off: list[bool] = []
    log.info("conversation %s: its client left before the model answered; its stream is kept", conversation)

    async def stop() -> None:
        if not opening.done():
            called_off.append(True)
            opening.cancel()  # the load's wait and the request end; the slot is let go
            return
        opened = _opened(opening)
        if opened is not None:
            await opened.stop()

    async def begin() -> None:
        produced = _chunks(surface, opening, called_off)
        try:
            await streams.start(
                conversation, surface.name, _model_id(manager, named), produced, stop, surface.stream_error,
                failed=lambda: (o := _opened(opening)) is not None and o.relay.broke,
                holder=holders.of(request), request=replay_key(request))
        except Exception as exc:  # refused (the streams' total cap): nobody is left to tell, nothing runs
            log.warning("conversation %s: its client left while the model loaded and its stream was not kept "
                        "(%s)", conversation, exc)
            await close_quietly(produced)
            await _discard(opening)
    _keep(begin())


async def _begun(request: HttpRequest, conversation: str, opening: asyncio.Task) -> None:
    """An adopted request whose conversation has a live stream: recorded once
    the model's process has begun its stream; a load or request that fails
    leaves the running stream alone (nobody is left to tell: logged)."""
    try:
        opened = await opening
    except (asyncio.CancelledError, Exception) as exc:
        log.warning("conversation %s: its client left and its model did not begin (%s); the running stream "
                    "is left alone", conversation, exc or "stopped")
        return
    if isinstance(opened, HttpResponse):
        log.warning("conversation %s: its client left and the model's process refused it (%s); the running "
                    "stream is left alone", conversation, _refusal(opened))
        return
    await _unread(asyncio.ensure_future(_start(request, conversation, opened)))


async def _chunks(surface: surfaces.Surface, opening: asyncio.Task, called_off: list[bool]) -> AsyncIterator[bytes]:
    """What an adopted request's stream holds: the model's stream once it
    begins, or the error event of a load or request that failed."""
    try:
        opened = await opening
    except asyncio.CancelledError:
        if called_off:  # stopped before the model answered: the stream ends empty, `stopped`
            return
        raise
    except RouterError as exc:
        yield surface.stream_error(exc.message)
        return
    if isinstance(opened, HttpResponse):
        yield surface.stream_error(_refusal(opened), "invalid_request_error" if opened.status_code < 500 else None)
        return
    relayed = opened.relay.__aiter__()
    try:
        async for chunk in relayed:
            yield chunk
    finally:
        await close_quietly(relayed)


def _opened(opening: asyncio.Task) -> Opened | None:
    """The stream `opening` brought, once it has."""
    if not opening.done() or opening.cancelled() or opening.exception() is not None:
        return None
    result = opening.result()
    return None if isinstance(result, HttpResponse) else result


async def _discard(opening: asyncio.Task) -> None:
    opening.cancel()
    try:
        await opening
    except (asyncio.CancelledError, Exception):
        return
    opened = _opened(opening)
    if opened is not None:
        opened.relay.close()


def _model_id(manager: Manager, named: str | None) -> str | None:
    try:
        return manager.resolve(named).id
    except RouterError:
        return None


def _refusal(reply: HttpResponse) -> str:
    """The message of an error reply in any protocol's shape."""
    try:
        body = json.loads(reply.content)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    return message or f"the model's process answered {reply.status_code} without a stream"
