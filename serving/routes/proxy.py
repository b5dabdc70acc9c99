"""Router mode's proxy: `/v1` requests forwarded to the process of the
model they name, `/stats` and `/metrics` gathered from every process (the
model-management routes are serving/routes/model_slots.py).

Forwarding keeps the request as the client sent it (method, path, query
string, body bytes, multipart included) but for the credentials: the
client's key is checked here, the child gets the router's own. Replies
stream back chunk by chunk as the child writes them. A child that dies
mid-reply ends a stream with an error event in the route's protocol, and
a reply not yet started with a 502.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable
from urllib.parse import quote

import httpx
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from core import holders, surfaces
from inference.protocols.errors import RequestError
from serving import traces
from serving.router import aggregate
from serving.router.manager import MakeWay, Manager
from serving.router.owners import HOP_HEADER, MODEL_HEADER, refused_hop
from serving.router.slots import ModelNotFound, RouterError, Slot
from serving.routes import errors, proxy_streams, responses
from serving.routes.pipeline import conversation_id
from serving.streams.store import TAKEN

log = logging.getLogger("hearth.router")

# answered by the router itself (it records the resumable streams: /v1/stream/{id}, /v1/streams/lookup)
OWN_V1 = ("/v1/models", "/v1/docs", "/v1/openapi.json", "/v1/memory/", "/v1/stream/", "/v1/streams/")
# outside /v1, but about one model: its process answers
ENGINE_ROUTES = frozenset({"/fit", "/api/fit/measure", "/signal", "/generate", "/props"})
FAN_OUT = ("/admin/cache/flush", "/admin/cache/session/close")
# Not passed on: hop-by-hop headers, the client's credentials (the child takes the router's key), and
# what the router's own access checks already judged (a browser's Origin would look foreign to the
# child, which listens on another port).
_HOP = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
                  "proxy-authorization", "authorization", "x-api-key", "cookie", "trailer", "origin", "referer",
                  "sec-fetch-site", "sec-fetch-mode", "sec-fetch-dest", "sec-fetch-user", HOP_HEADER, MODEL_HEADER,
                  holders.HEADER.lower()})
_REPLY_HOP = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding", "server", "date"})


def routed(path: str) -> bool:
    """Whether the router forwards `path` rather than answering it."""
    if path in FAN_OUT or path in ENGINE_ROUTES:
        return True
    if not path.startswith("/v1/") or path == "/v1/":
        return False
    return not any(path == own.rstrip("/") or path.startswith(own) for own in OWN_V1)


BIG_BODY = 1 << 20  # bodies this large are parsed off the event loop
AUDIO = "/v1/audio/"  # transcription, translation, live sessions: a model's process with a Whisper model
SESSIONS = "/v1/audio/sessions"  # a live take lives in one process: always the default model's


def _serves(manager: Manager, named: str | None) -> bool:
    """Whether `named` is a model this router serves (a library model, or a remote host's)."""
    return named is not None and (manager.catalog.resolve(named) is not None
                                  or named in manager.remote_hosts.entries)


def _named_model(request: HttpRequest) -> tuple[str | None, bool]:
    """The `model` a request names (a JSON body's field, a form field, or the
    query string's), and whether its JSON body asks for a stream. A body is
    read as the model's process reads it: as JSON whatever its content type
    says (`curl -d` labels JSON a form), a form only when it is not JSON.
    RequestError: a JSON `model` that is not a string."""
    content_type = request.content_type or ""
    if request.method in ("POST", "PUT", "PATCH") and request.body:
        if content_type.startswith("multipart/"):
            return request.POST.get("model"), False  # parsed from the body bytes kept above, which go on intact
        body = _json_object(request.body)
        if body is None and content_type == "application/x-www-form-urlencoded":
            return request.POST.get("model"), False
        if body is None:
            return None, False  # the child answers the bad body in its protocol
        value = body.get("model")
        if value is not None and not isinstance(value, str):  # as a model's process refuses it (its Schema)
            raise RequestError("model: Input should be a valid string", "model")
        return value, body.get("stream") is True
    return request.GET.get("model"), False


def _json_object(raw: bytes) -> dict | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def dispatch(request: HttpRequest) -> HttpResponse:
    manager: Manager = request.runtime.router
    path = request.path
    if path.startswith("/v1/responses/") and request.method in ("GET", "DELETE"):
        return await _stored_here(request) or await _fan_out(request, manager)
    if path in FAN_OUT:
        return await _fan_out(request, manager)
    big = len(request.body) > BIG_BODY and not (request.content_type or "").startswith("multipart/")
    try:
        named, streaming = await asyncio.to_thread(_named_model, request) if big else _named_model(request)
        conversation = conversation_id(request) if streaming and request.method == "POST" else None
    except RequestError as exc:
        return errors.request_error(surfaces.for_path(path), exc)
    # The conversation's live stream runs on until this request's own has begun (proxy_streams.py).
    if conversation is not None and await request.runtime.streams.taken(conversation, holders.of(request)):
        return errors.render(surfaces.for_path(path), 409, TAKEN, param="X-Conversation-Id")
    hop = _from_peer(request, manager)
    if hop:
        named = request.headers.get(MODEL_HEADER) or named
    elif path.startswith(AUDIO) and (path.startswith(SESSIONS) or not _serves(manager, named)):
        building = request.runtime.speech_build or {}
        if request.runtime.whisper_model is None and building.get("state") in BUILDING:
            return errors.engine_error(surfaces.for_path(path), RouterError(
                f"transcription is not offered yet: the demo speech model {building.get('model')} is being built in "
                f"the background ({_progress(building)}; GET /health shows the progress)"))
        if manager.default is None:
            return errors.engine_error(surfaces.for_path(path), ModelNotFound(
                "transcription in router mode is answered by the default model's process, with the Whisper model "
                "beside it (`model` names a served model or none: `whisper-1` is fine); this server has no default "
                "model: start it with --default-model, or set one with POST /models/default"))
        named = None  # `whisper-1`, a Whisper repo, a live take: the default model's process answers

    def opening(token: str | None = None, make_way: MakeWay | None = None) -> Awaitable[HttpResponse | Opened]:
        return _open(request, manager, named, hop, token, make_way)
    if conversation is not None:
        return await proxy_streams.forward(request, manager, conversation, named, opening)
    try:
        opened = await opening()
    except RouterError as exc:
        return errors.engine_error(surfaces.for_path(path), exc)
    if isinstance(opened, Opened):
        return StreamingHttpResponse(opened.relay, status=opened.status, headers=opened.headers)
    return opened


async def _open(request: HttpRequest, manager: Manager, named: str | None, hop: bool, token: str | None,
                make_way: MakeWay | None) -> HttpResponse | Opened:
    """`named`'s process (loaded first) and its answer to the request: an
    `Opened` stream, or a whole reply. RouterError: no process took it."""
    slot = await manager.acquire(named, hop=hop, make_way=make_way)
    try:
        return await _forward(request, manager, slot, token)
    except _PeerGone:  # its claim is dropped; served here (never passed to a node again)
        pass
    return await _forward(request, manager, await manager.take_over(named, slot), token)


BUILDING = ("waiting", "starting", "training", "handing over")  # the demo speech model's states before "done"


def _progress(build: dict) -> str:
    state = build.get("state")
    if state == "waiting":
        return "it starts once the demo chat model is trained"
    if state == "training":
        return f"step {build.get('step')} of {build.get('steps')}"
    if state == "handing over":
        return "built: the default model's process is starting again with it"
    return "preparing its training data"


class _PeerGone(Exception):
    """Another web node did not take the request (gone, draining, or it refused the hop's key)."""


def _from_peer(request: HttpRequest, manager: Manager) -> bool:
    """Whether another web node passed this request on (its mark, with the cluster's hop key): served here."""
    key = manager.cluster.hop_key
    if not key or not request.headers.get(HOP_HEADER):
        return False
    scheme, _, value = (request.headers.get("authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), key.encode())


def _target(request: HttpRequest) -> str:
    """The path and query as the client sent them (still percent-encoded,
    so an id holding `%2F` reaches the same route in the child)."""
    raw = getattr(request, "scope", {}).get("raw_path")
    path = raw.decode("latin-1") if raw else quote(request.path)
    query = request.META.get("QUERY_STRING", "")
    return path + (f"?{query}" if query else "")


def _headers(request: HttpRequest, manager: Manager, slot: Slot) -> dict:
    """What a forwarded request carries: the client's headers less the hop's,
    the credentials for `slot`, and to a model process of ours or another web
    node (which take it from our key), the request's holder. A remote host
    (--models-remote) holds what we send it under the key we send."""
    out = {k: v for k, v in request.headers.items() if k.lower() not in _HOP and k.lower() != traces.HEADER.lower()}
    out[traces.HEADER] = getattr(request, "trace_id", None) or traces.trace_id(None)  # both logs name it alike
    holder = holders.of(request)
    if holder and (slot.remote is None or slot.remote.node is not None):
        out[holders.HEADER] = holder
    return {**out, **manager.hop_headers(slot)}


async def _forward(request: HttpRequest, manager: Manager, slot: Slot, token: str | None = None
                   ) -> HttpResponse | Opened:
    """The request sent to `slot`'s process: its stream (`Opened`), or its
    whole reply. With `token`, the model's process knows the generation by
    that name (X-Conversation-Id), for its stop."""
    client = http_client(manager)
    headers = _headers(request, manager, slot)
    if token is not None:
        headers = {k: v for k, v in headers.items() if k.lower() != "x-conversation-id"}
        headers["x-conversation-id"] = token
    outgoing = client.build_request(request.method, slot.url + _target(request), content=request.body,
                                    headers=headers)
    try:
        reply = await client.send(outgoing, stream=True)
    except httpx.HTTPError as exc:
        manager.release(slot)
        if isinstance(exc, httpx.ReadTimeout):
            manager.went_silent(slot)
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):  # not one slow or odd reply
            if slot.remote is not None and slot.remote.node is not None:
                raise _PeerGone() from exc
            manager.remote_down(slot, _died_message(slot, exc))
        return _died(request.path, slot, exc)
    except BaseException:  # the client went away (cancelled): the model is not busy for it any more
        manager.release(slot)
        raise
    if slot.remote is not None and slot.remote.node is not None and refused_hop(reply):
        try:
            await reply.aclose()
        finally:
            manager.release(slot)
        log.warning("web node %s answered %d for %s; serving it here", slot.url, reply.status_code, slot.id)
        raise _PeerGone()
    headers = {k: v for k, v in reply.headers.items() if k.lower() not in _REPLY_HOP}
    if not reply.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            content = await reply.aread()
        except httpx.HTTPError as exc:
            if isinstance(exc, httpx.ReadTimeout):
                manager.went_silent(slot)
            return _died(request.path, slot, exc)
        finally:
            await reply.aclose()
            manager.release(slot)
        response = HttpResponse(content, status=reply.status_code, headers=headers)
        # A model's process on this machine logged its own 4xx (its lines name the model): Django's line here
        # would say it twice.
        response._has_been_logged = slot.remote is None
        return response
    return Opened(manager, slot, _Relay(request.path, manager, slot, reply), reply.status_code, headers, token)


class Opened:
    """A model's stream, begun: what the router relays, and how it stops the
    generation (the model's own `DELETE /v1/stream/{token}`)."""

    def __init__(self, manager: Manager, slot: Slot, relay: _Relay, status: int, headers: dict,
                 token: str | None):
        self.manager, self.slot, self.relay, self.status, self.headers, self.token = \
            manager, slot, relay, status, headers, token

    async def stop(self) -> None:
        try:
            await http_client(self.manager).delete(f"{self.slot.url}/v1/stream/{self.token}", timeout=10.0,
                                                   headers=self.manager.hop_headers(self.slot))
        except httpx.HTTPError as exc:  # the process is gone: its stream has ended (or will) by itself
            log.warning("stopping stream %s in %s: %s", self.token, self.slot.id, exc)


class _Relay:
    """A model's stream, passed on chunk by chunk. The slot is released and
    the child's reply closed once, however the stream ends: finished,
    broken, or dropped by the client, even before its first chunk (Django
    then only calls `close`, from another thread)."""

    def __init__(self, path: str, manager: Manager, slot: Slot, reply: httpx.Response):
        self.path, self.manager, self.slot, self.reply = path, manager, slot, reply
        self.loop = asyncio.get_running_loop()
        self.done = False
        self.broke = False  # the model's stream broke off: it ends with an error event of ours

    def __aiter__(self):
        return self._chunks()

    async def _chunks(self):
        ended = True  # at an event boundary, where an error event may follow
        surface = surfaces.for_path(self.path)
        numbers = surfaces.EventNumbers() if surface.numbered else None  # the error event is numbered next
        try:
            async for chunk in self.reply.aiter_raw():
                ended = chunk.endswith(b"\n\n")
                if numbers is not None:
                    numbers.feed(chunk)
                yield chunk
        except httpx.HTTPError as exc:
            log.warning("%s: the stream from %s broke: %s", self.path, self.slot.id, exc)
            if isinstance(exc, httpx.ReadTimeout):
                self.manager.went_silent(self.slot)
            self.broke = True
            failed = surface.stream_error(_died_message(self.slot, exc))
            if numbers is not None:
                failed = surface.follows(failed, numbers.last)
            yield (b"" if ended else b"\n\n") + failed
        finally:
            self._finish()

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        self.manager.release(self.slot)
        asyncio.ensure_future(self.reply.aclose())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._finish)


def _died_message(slot: Slot, exc: Exception) -> str:
    if slot.remote is not None:
        return (f"model {slot.id!r} is served by {slot.remote.url}, which stopped answering "
                f"({type(exc).__name__}); the router looks at it again every few seconds")
    if isinstance(exc, httpx.TimeoutException):
        return f"model {slot.id!r} sent nothing for longer than the router waits (--child-timeout)"
    return (f"model {slot.id!r} stopped answering ({type(exc).__name__}: its process exited or was killed); "
            f"it is loaded again on the next request")


def _died(path: str, slot: Slot, exc: Exception) -> JsonResponse:
    status, code = (504, "model_timeout") if isinstance(exc, httpx.TimeoutException) else \
        (502, "model_process_exited")
    return surfaces.for_path(path).response(status, _died_message(slot, exc), code, "server_error")


async def _stored_here(request: HttpRequest) -> HttpResponse | None:
    """GET or DELETE of a stored Responses turn, or GET of its input items,
    answered from the store the router shares with its models' processes
    (hearth/router_mode.py: a folder, or Redis) by the route itself; None
    when it is not there."""
    path = request.path.removeprefix("/v1/responses/")
    if path.endswith("/input_items") and request.method == "GET":
        view, response_id = responses.input_items, path.removesuffix("/input_items")
    else:
        view, response_id = (responses.retrieve if request.method == "GET" else responses.delete), path
    try:
        return await asyncio.to_thread(view, request, response_id)
    except RequestError as exc:
        if exc.status != 404:
            raise
        return None


async def _fan_out(request: HttpRequest, manager: Manager) -> HttpResponse:
    """A stored response the router's store lacks (a remote host's): ask each
    loaded model and take the first answer that is not a 404. The
    prompt-cache admin routes go to every loaded model; their answers are
    combined by model."""
    client = http_client(manager)
    answers: dict[str, httpx.Response] = {}
    for slot in manager.loaded_here():
        try:
            reply = await client.request(request.method, slot.url + _target(request), content=request.body,
                                         headers=_headers(request, manager, slot))
        except httpx.HTTPError:
            continue
        answers[slot.id] = reply
        if request.path not in FAN_OUT and reply.status_code != 404:
            return _copy(reply)
    if request.path in FAN_OUT:
        bodies = {model: _json(reply) for model, reply in answers.items()}
        status = max((r.status_code for r in answers.values()), default=200)
        return JsonResponse({"models": bodies}, status=status)
    if answers:
        return _copy(next(iter(answers.values())))
    return surfaces.for_path(request.path).response(404, f"no stored response {request.path.rsplit('/', 1)[-1]!r}",
                                                    "not_found", "invalid_request_error")


def _copy(reply: httpx.Response) -> HttpResponse:
    return HttpResponse(reply.content, status=reply.status_code, content_type=reply.headers.get("content-type"))


def _json(reply: httpx.Response):
    try:
        return reply.json()
    except ValueError:
        return {"status": reply.status_code}


def http_client(manager: Manager) -> httpx.AsyncClient:
    return manager.client()


async def _gather(manager: Manager, path: str, read) -> dict:
    """`path` of every loaded model, concurrently, by model id (a child that
    does not answer in time is left out)."""
    client = http_client(manager)
    slots = manager.loaded_here()

    async def one(slot: Slot):
        try:
            reply = await client.get(slot.url + path, headers=manager.hop_headers(slot), timeout=5.0)
            return slot.id, read(reply) if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return slot.id, None
    return {k: v for k, v in await asyncio.gather(*(one(s) for s in slots)) if v is not None}


async def stats(request: HttpRequest, own: dict) -> JsonResponse:
    manager: Manager = request.runtime.router
    children = await _gather(manager, "/stats", lambda r: r.json())
    router = {"default": manager.default, "models_max": manager.settings.models_max,
              "idle_unload_s": manager.settings.idle_unload_s,
              "loaded": [s.id for s in manager.loaded()],
              "states": {row["id"]: row["status"] for row in manager.rows()}}
    return JsonResponse(aggregate.merge_stats(own, children, router))


async def metrics(request: HttpRequest, own: bytes, content_type: str) -> HttpResponse:
    children = await _gather(request.runtime.router, "/metrics", lambda r: r.text)
    return HttpResponse(aggregate.merge_metrics(own, children), content_type=content_type)
