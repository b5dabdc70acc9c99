"""Live transcription sessions (`/v1/audio/sessions`), for audio sent while
it is recorded (the dashboard's hold-to-talk).

- `POST /v1/audio/sessions`: JSON params (the one-shot fields but
  `stream` and `vad_trim`; `response_format` json | verbose_json) ->
  `{"id", "model"}`; the weights load here if they were out. At most 64
  open (429).
- `POST /v1/audio/sessions/<id>/audio`: one chunk, raw `audio/pcm;rate=16000`
  little-endian float32 mono, or any container ffmpeg reads. The voice-
  activity model judges it (`speech`: whether the take has had speech so
  far). Every window of 30 s completed by it is transcribed before the
  answer `{"samples", "duration", "speech", "segments"}`; with `vad: true`,
  a window that completes before any speech is skipped, never transcribed.
- `POST /v1/audio/sessions/<id>/finish`: the rest is transcribed (with
  `vad: true` and no speech in the take, nothing: `{"text": ""}`, Whisper
  never runs); answers the one-shot body and closes the session.
- `DELETE /v1/audio/sessions/<id>`: discard (204).
- `GET /v1/audio/sessions/<id>/events`: the session as server-sent events,
  from its start: `transcript.text.delta` per segment as its window is
  transcribed (partial text while the take goes on), `transcript.progress`
  after each chunk, and `transcript.text.done` with the final body when it
  finishes (or `transcript.closed` when it is deleted); then the stream ends.

Unknown ids are 404, a finished session 409. Chunks of one session are
taken one at a time in the order they arrive (a lock per session).
"""
from __future__ import annotations

import asyncio
import secrets
import time
from typing import Literal

import numpy as np
from django.http import HttpRequest, HttpResponse, JsonResponse

from core import audio, limits, sse
from core.openapi import NO_BODY, documented
from core.surfaces import OPENAI
from inference.engine import vad
from inference.engine.speech import MAX_SESSIONS, Session, Take
from inference.protocols import transcription
from inference.protocols.errors import RequestError
from serving.routes.audio import TakeFields, decode, ignored_header, result, transcriber, vad_report, window
from serving.routes.pipeline import read_body

router = OPENAI.router(tags=["audio"])
KEEP_ALIVE_S = 15.0  # a comment line on an idle event stream, so proxies keep it open


class SessionRequest(TakeFields):
    """A live session's parameters (all optional)."""

    response_format: Literal["json", "verbose_json"] = "json"


CHUNK = {"requestBody": {"required": True, "content": {
    "audio/pcm": {"schema": {"type": "string", "format": "binary",
                             "description": "little-endian float32 mono at 16 kHz (`audio/pcm;rate=16000`)"}},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary",
                                            "description": "any container ffmpeg reads"}}}}}


def _session(request: HttpRequest, session_id: str, open_only: bool = True) -> Session:
    found = request.runtime.audio_sessions.get(session_id)
    if found is None:
        raise RequestError(f"no transcription session {session_id!r}", None, 404, code="session_not_found")
    if open_only and found.finished:
        raise RequestError(f"transcription session {session_id} is finished", None, 409, code="session_finished")
    return found


@router.post("/audio/sessions", openapi_extra=documented(SessionRequest))
async def open_session(request: HttpRequest):
    body = await read_body(request) if request.body else {}
    ask = transcription.ask(body, "transcribe", formats=("json", "verbose_json"), live=True)
    if ask.stream:
        raise RequestError("stream is for a one-shot transcription: a session's text streams from GET "
                           "/v1/audio/sessions/{id}/events", "stream")
    service = transcriber(request)
    if ask.gate is not None:
        try:
            vad.weights_path()
        except vad.VadUnavailable as exc:
            raise RequestError(str(exc), "vad") from None
    session = Session("sess_" + secrets.token_hex(12), Take(ask.options), ask.response_format, gate=ask.gate)
    if not request.runtime.audio_sessions.add(session):
        raise RequestError(f"{MAX_SESSIONS} transcription sessions are open; finish or delete one first", None,
                           429, "rate_limit_error", code="too_many_sessions")
    await asyncio.wrap_future(service.submit(lambda model: None))  # pages the weights in now
    return JsonResponse({"id": session.id, "object": "transcription.session", "model": service.ref,
                         "response_format": session.response_format},
                        headers=ignored_header(body, SessionRequest))


@router.post("/audio/sessions/{session_id}/audio", openapi_extra=CHUNK)
async def session_audio(request: HttpRequest, session_id: str):
    session = _session(request, session_id)
    service = transcriber(request)
    samples = await decode(request.body, (request.content_type or "") + _params(request))
    async with session.lock:
        if session.finished:
            raise RequestError(f"transcription session {session_id} is finished", None, 409,
                               code="session_finished")
        if session.samples + len(samples) > limits.current().max_audio_seconds * audio.RATE:
            raise RequestError(str(audio.too_long((session.samples + len(samples)) / audio.RATE)), None, 413,
                               code="audio_too_long")
        session.add(samples)
        speech = await _judge(session, samples)
        before = len(session.take.segments)
        while (full := session.full_window()) is not None:
            if session.gate is None or speech:
                await window(service, session.take, *full)
        _announce(session, before)
    return {"samples": session.samples, "duration": round(session.samples / audio.RATE, 3), "speech": speech,
            "segments": [transcription.segment(s) for s in session.take.segments]}


async def _judge(session: Session, samples, final: bool = False) -> bool | None:
    """The chunk through the voice-activity model: whether the take has had
    speech so far (None where the model is not installed and the session
    did not ask for the gate, which was checked when it opened)."""
    started = time.monotonic()
    try:
        await asyncio.to_thread(session.detector.feed, samples, final)
    except vad.VadUnavailable:
        return None
    session.vad_ms += (time.monotonic() - started) * 1000
    if not session.speech:
        await asyncio.to_thread(session.heard)
    return session.speech


def _params(request: HttpRequest) -> str:
    """The content type's parameters (`;rate=16000`), which Django keeps apart."""
    return "".join(f";{k}={v}" for k, v in request.content_params.items())


@router.post("/audio/sessions/{session_id}/finish", openapi_extra=NO_BODY)
async def finish_session(request: HttpRequest, session_id: str):
    session = _session(request, session_id)
    service = transcriber(request)
    started = time.monotonic()
    async with session.lock:
        if session.finished:
            raise RequestError(f"transcription session {session_id} is finished", None, 409,
                               code="session_finished")
        session.finished = True
        load_ms = 0.0
        before = len(session.take.segments)
        spans: list[tuple[int, int]] = []
        if session.gate is not None:
            await _judge(session, np.zeros(0, np.float32), final=True)  # the last partial frame
            spans = session.heard()
            session.take.vad = vad_report(spans, time.monotonic() - session.vad_ms / 1000)
        rest = session.rest()
        if rest is not None and (session.gate is None or spans):
            load_ms = (await window(service, session.take, *rest))[1]
        _announce(session, before)
    service.requests += 1
    ms = round((time.monotonic() - started) * 1000, 1)
    timings = {"load_ms": load_ms, "transcribe_ms": ms, "total_ms": ms}
    body = result(service, session.take, session.response_format, session.samples / audio.RATE, timings)
    session.publish({"type": "transcript.text.done", **body}, close=True)
    return JsonResponse(body)


def _announce(session: Session, before: int) -> None:
    """The segments transcribed since `before`, and how far the take is, to the session's listeners."""
    deltas = [{"type": "transcript.text.delta", "delta": seg["text"],
               "segment": {"id": seg["id"], "start": seg["start"], "end": seg["end"]}}
              for seg in session.take.segments[before:]]
    session.publish(*deltas, {"type": "transcript.progress", "samples": session.samples,
                              "duration": round(session.samples / audio.RATE, 3)})


@router.get("/audio/sessions/{session_id}/events")
async def session_events(request: HttpRequest, session_id: str):
    """The session's partial and final text as server-sent events (see the module's docstring)."""
    session = _session(request, session_id, open_only=False)

    async def frames():
        sent = 0
        while True:
            changed = session.changed
            while sent < len(session.events):
                yield sse.frame(session.events[sent])
                sent += 1
            if session.closed:
                return
            try:
                await asyncio.wait_for(changed.wait(), KEEP_ALIVE_S)
            except TimeoutError:
                yield sse.KEEP_ALIVE

    return OPENAI.sse(frames())


@router.delete("/audio/sessions/{session_id}")
async def delete_session(request: HttpRequest, session_id: str):
    session = _session(request, session_id, open_only=False)
    request.runtime.audio_sessions.drop(session_id)
    session.publish({"type": "transcript.closed", "id": session_id}, close=True)
    return HttpResponse(status=204)
