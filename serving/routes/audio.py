"""`POST /v1/audio/transcriptions` and `POST /v1/audio/translations`.

A body is OpenAI's multipart upload (`file` and form fields) or a JSON
object whose `file` (or `input_audio`, `audio`) is base64 or a `data:`
URL. The audio is decoded by ffmpeg (core.audio) off the event loop, then
transcribed window by window on the engine thread (inference.engine.speech),
each window one exclusive call, so chat requests run between windows of a
long file. `stream=true` answers server-sent events: a
`transcript.text.delta` per segment, `transcript.progress` per window and
`transcript.text.done` with the whole body.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Literal

import numpy as np
from django.core.exceptions import BadRequest, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from pydantic import BaseModel, Field

from core import audio, media, sse
from core.openapi import documented
from core.surfaces import OPENAI
from inference.engine import vad
from inference.engine.errors import EngineError, EngineTimeout
from inference.engine.speech import SHORTEST, WINDOW, NoWhisperModel, Options, Take, Transcriber, windows
from inference.protocols import transcription, unhonoured
from inference.protocols.chat import AUDIO_PARTS
from inference.protocols.errors import RequestError
from serving.routes.pipeline import IGNORED_HEADER, read_body

router = OPENAI.router(tags=["audio"])
WAIT_S = 600.0  # one window may wait this long for the engine
TRIM = audio.RATE // 2  # `vad_trim` keeps this much audio either side of the speech


class TakeFields(BaseModel):
    """How a take is transcribed: a one-shot request's fields and a live session's
    (inference/protocols/transcription.py reads them)."""

    language: str | None = Field(None, description="ISO 639-1 code or name; omitted or `auto`: detected")
    prompt: str | None = Field(None, description="text the transcription continues (vocabulary, style)")
    temperature: float | None = Field(None, ge=0, le=1, description="omitted: the fallback ladder 0, 0.2, … 1")
    timestamp_granularities: list[Literal["segment", "word"]] | None = Field(
        None, description="`word` adds word timestamps (verbose_json)")
    vocabulary: list[str] | str | None = Field(None, description="recognition hints: a list, or comma-separated "
                                               "text; fitted whole-term into the prompt, reported in usage")
    keywords: list[str] | None = Field(None, description="OpenAI's name for `vocabulary` (send one of the two)")
    languages: list[str] | None = Field(None, description="OpenAI's possible languages: one entry is `language`; "
                                        "more are refused (Whisper detects among all it knows)")
    condition_on_previous_text: bool = True
    no_speech_threshold: float | None = Field(None, ge=0, le=1, description="default 0.6")
    without_timestamps: bool = False
    beam_size: Literal[1] | None = Field(None, description="1 only: mlx-whisper decodes greedily")
    vad: bool = Field(False, description="the voice-activity gate: Whisper runs only on audio with speech in it")
    vad_threshold: float | None = Field(None, ge=0, le=1, description="a frame's speech probability that "
                                        "counts as speech (0.5; with vad)")
    vad_min_speech_ms: int | None = Field(None, ge=0, le=60000, description="shorter speech is ignored (250; "
                                          "with vad)")


class TranscriptionRequest(TakeFields):
    """The fields of a transcription or translation (a JSON body, or the form fields of a multipart one)."""

    file: str = Field(description="the audio: base64 or a data: URL (multipart: the uploaded file)")
    model: str | None = Field(None, description="ignored: the server's Whisper model is used")
    response_format: Literal["json", "text", "srt", "vtt", "verbose_json"] = "json"
    stream: bool = False
    vad_trim: bool = Field(False, description="with vad: crop to the speech ± 0.5 s first (timestamps stay the "
                           "clip's)")


MULTIPART = {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file"],
    "properties": {"file": {"type": "string", "format": "binary"},
                   **{k: v for k, v in TranscriptionRequest.model_json_schema()["properties"].items()
                      if k != "file"}}}}}


def transcriber(request: HttpRequest) -> Transcriber:
    found = getattr(request.runtime, "transcriber", None)
    if found is None:
        raise NoWhisperModel("transcription is not available in this process (start `hearth serve MODEL "
                             "--whisper-model REPO_OR_DIR`)")
    found.require()
    return found


async def decode(data: bytes, content_type: str | None = None) -> np.ndarray:
    """Audio bytes -> 16 kHz float32 (raw PCM as is, anything else through ffmpeg); 400 when undecodable."""
    try:
        rate = audio.pcm_rate(content_type) if content_type else None
        if rate is not None:
            if rate != audio.RATE:
                raise audio.AudioError(f"raw PCM must be 16000 Hz (got rate={rate}); send another container "
                                       "to have it resampled")
            return audio.pcm(data)
        return await asyncio.to_thread(audio.decode, data)
    except audio.AudioTooLong as exc:
        raise RequestError(str(exc), "file", 413, code="audio_too_long") from None
    except audio.AudioError as exc:
        raise RequestError(str(exc), "file") from None


async def _form(request: HttpRequest) -> tuple[dict, bytes]:
    """The fields and the audio bytes of a multipart or JSON body; 415 for any other type."""
    kind = (request.content_type or "").lower()
    if kind == "multipart/form-data":
        try:
            upload = request.FILES.get("file")
            # A repeated field (`timestamp_granularities[]`) is every value it was sent with, under its bare name.
            fields = {k.removesuffix("[]"): request.POST.getlist(k) if k.endswith("[]") else request.POST.get(k)
                      for k in request.POST}
        except (MultiPartParserError, SuspiciousOperation, BadRequest) as exc:
            raise RequestError(f"unreadable multipart body: {exc}") from None
        if upload is None:
            raise RequestError("a `file` part with the audio is required", "file")
        return fields, upload.read()
    if kind == "application/json":
        body = await read_body(request)
        return body, json_audio(body)
    raise RequestError(f"unsupported content type {kind or '(none)'}: send multipart/form-data (a `file` upload) "
                       "or application/json (base64 `file`)", None, 415, code="unsupported_media_type")


def json_audio(body: dict) -> bytes:
    """The audio of a JSON body: `file`, `input_audio` ({data} or a string) or `audio`."""
    for name in transcription.AUDIO_ALIASES:
        value = body.get(name)
        if isinstance(value, dict):
            value = value.get("data")
        if value is None:
            continue
        if not isinstance(value, str):
            raise RequestError(f"{name} must be base64 audio or a data: URL", name)
        try:
            return audio.from_base64(value)
        except audio.AudioError as exc:
            raise RequestError(str(exc), name) from None
    raise RequestError("`file` (base64 audio or a data: URL) is required", "file")


async def window(service: Transcriber, take: Take, samples: np.ndarray, offset: int) -> tuple[list[dict], float]:
    """One window on the engine thread: its segments and the ms spent loading the model."""
    future = asyncio.wrap_future(service.submit(lambda model: take.window(model, samples, offset)))
    try:
        added, load_ms = await asyncio.wait_for(future, WAIT_S)
    except TimeoutError:
        raise EngineTimeout("the engine stayed busy; try again later") from None
    return added, load_ms


def result(service: Transcriber, take: Take, fmt: str, duration: float, timings: dict) -> dict:
    extra = {"model": service.ref, "language": take.language, "duration": round(duration, 3), "timings": timings}
    if take.vocabulary is not None:
        extra["vocabulary"] = take.vocabulary
    if take.vad is not None:
        extra["vad"] = take.vad
    return transcription.body(take.text, take.segments, fmt, task=take.options.task, language=take.language,
                              duration=duration, extra=extra, words=take.options.words)


def _timings(load_ms: float, started: float, decoded: float) -> dict:
    now = time.monotonic()
    return {"load_ms": round(load_ms, 1), "decode_ms": round((decoded - started) * 1000, 1),
            "transcribe_ms": round((now - decoded) * 1000, 1), "total_ms": round((now - started) * 1000, 1)}


def vad_report(spans: list[tuple[int, int]], started: float) -> dict:
    """`hearth.vad` of a reply: whether there was speech, where (seconds), and what finding it took."""
    return {"speech": bool(spans), "segments": [[round(s / audio.RATE, 3), round(e / audio.RATE, 3)]
                                                for s, e in spans],
            "ms": round((time.monotonic() - started) * 1000, 1)}


async def gated(ask: transcription.Ask, take: Take, samples: np.ndarray) -> tuple[np.ndarray, int]:
    """The audio Whisper is to hear and where it starts in the clip: with
    `vad: true`, none when the gate hears no speech (Whisper never runs),
    with `vad_trim` the speech ± TRIM_S; its report is kept on the take."""
    if ask.gate is None:
        return samples, 0
    started = time.monotonic()
    try:
        spans = await asyncio.to_thread(vad.detect, samples, ask.gate)
    except vad.VadUnavailable as exc:
        raise RequestError(str(exc), "vad", 400) from None
    take.vad = vad_report(spans, started)
    if not spans:
        return samples[:0], 0
    if not ask.trim:
        return samples, 0
    start = max(0, spans[0][0] - TRIM)
    return samples[start:min(len(samples), spans[-1][1] + TRIM)], start


async def _frames(service: Transcriber, take: Take, samples: np.ndarray, base: int, fmt: str, started: float,
                  decoded: float, duration: float) -> AsyncIterator[bytes]:
    load_ms, offsets = 0.0, windows(len(samples)) if len(samples) else []
    total = len(samples) // 160
    try:
        for offset in offsets:
            added, loaded = await window(service, take, samples[offset:offset + WINDOW], base + offset)
            load_ms += loaded
            for seg in added:
                yield sse.frame({"type": "transcript.text.delta", "delta": seg["text"],
                                 "segment": {"id": seg["id"], "start": seg["start"], "end": seg["end"]}})
            yield sse.frame({"type": "transcript.progress",
                             "done": min(offset + WINDOW, len(samples)) // 160, "total": total})
        done = result(service, take, fmt if fmt == "verbose_json" else "json", duration,
                      _timings(load_ms, started, decoded))
        yield sse.frame({"type": "transcript.text.done", **done})
    except EngineError as exc:
        yield sse.frame({"type": "error", **OPENAI.error(exc.status, str(exc))})


async def _transcribe(request: HttpRequest, task: str) -> HttpResponse:
    started = time.monotonic()
    fields, data = await _form(request)
    ask = transcription.ask(fields, task)
    service = transcriber(request)
    samples = await decode(data)
    if len(samples) < SHORTEST:
        raise RequestError(f"the audio is {len(samples) / audio.RATE:.3f}s long; at least 0.1s is needed", "file")
    decoded = time.monotonic()
    service.requests += 1
    take = Take(ask.options)
    duration = len(samples) / audio.RATE
    heard, base = await gated(ask, take, samples)
    headers = ignored_header(fields, TranscriptionRequest)
    if ask.stream:
        return OPENAI.sse(_frames(service, take, heard, base, ask.response_format, started, decoded, duration),
                          headers)
    load_ms = 0.0
    # A client that goes away cancels this view (a 499, hearth/middleware.py): no later window runs.
    for offset in windows(len(heard)) if len(heard) else []:
        load_ms += (await window(service, take, heard[offset:offset + WINDOW], base + offset))[1]
    timings = _timings(load_ms, started, decoded)
    fmt = ask.response_format
    if fmt in transcription.CONTENT_TYPES:
        headers |= {"x-hearth-language": take.language or "", "x-hearth-timings": json.dumps(timings)}
        return HttpResponse(transcription.plain(take.text, take.segments, fmt),
                            content_type=transcription.CONTENT_TYPES[fmt], headers=headers)
    return JsonResponse(result(service, take, fmt, duration, timings), headers=headers)


def ignored_header(fields: dict, schema: type[BaseModel]) -> dict[str, str]:
    """The ignored-fields header (serving/routes/pipeline.py's) naming the fields nothing read."""
    names = unhonoured.ignored(fields, schema.model_fields,
                               {k: (bool, "") for k in (*transcription.AUDIO_ALIASES, *transcription.REFUSED)})
    return {IGNORED_HEADER: unhonoured.header_value(names)} if names else {}


@router.post("/audio/transcriptions", openapi_extra=documented(TranscriptionRequest, MULTIPART))
async def transcriptions(request: HttpRequest):
    return await _transcribe(request, "transcribe")


@router.post("/audio/translations", openapi_extra=documented(TranscriptionRequest, MULTIPART))
async def translations(request: HttpRequest):
    return await _transcribe(request, "translate")


async def _part_audio(part: dict, where: str) -> bytes:
    """The bytes of one audio content part: base64, a data: URL, or an
    http(s) URL fetched under the remote-media policy (core.media)."""
    kind = part["type"]
    if kind == "input_audio":
        inner = part.get("input_audio")
        value = inner.get("data") if isinstance(inner, dict) else None
    elif kind == "audio":
        value = part.get("data")
    else:
        inner = part.get("audio_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        if not isinstance(url, str):
            raise RequestError(f"{where}.audio_url.url must be a data: or http(s) URL", where)
        try:
            return (await asyncio.to_thread(media.load_media, url, "audio"))[0]
        except media.MediaRefused as exc:
            raise RequestError(f"{where}.audio_url: {exc}", where) from None
    if not isinstance(value, str):
        raise RequestError(f"{where} carries no base64 audio", where)
    try:
        return audio.from_base64(value)
    except audio.AudioError as exc:
        raise RequestError(str(exc), where) from None


async def _part_text(service: Transcriber, data: bytes, where: str) -> str:
    try:
        samples = await decode(data)
    except RequestError as exc:
        raise RequestError(exc.message, where) from None
    if len(samples) < SHORTEST:
        raise RequestError("the audio is shorter than 0.1s", where)
    take = Take(Options())
    for offset in windows(len(samples))[:1]:  # a clip counts its first 30 s, as an audio tower would
        await window(service, take, samples[offset:offset + WINDOW], offset)
    service.requests += 1
    return take.text


async def audio_parts_to_text(request: HttpRequest, body: dict) -> None:
    """Chat messages' audio parts, transcribed by the Whisper model into text
    parts in their place (the chat model has no audio tower); a 400 naming
    what is missing when no Whisper model is configured."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    found = [(m, i, f"messages[{n}].content[{i}]") for n, m in enumerate(messages) if isinstance(m, dict)
             and isinstance(m.get("content"), list)
             for i, p in enumerate(m["content"]) if isinstance(p, dict) and p.get("type") in AUDIO_PARTS]
    if not found:
        return
    service = getattr(request.runtime, "transcriber", None)
    if service is None or not service.available:
        raise RequestError("audio content parts need a speech model: the chat model has no audio tower and this "
                           "server has no Whisper model (start it with `--whisper-model REPO_OR_DIR`)",
                           found[0][2])
    for message, i, where in found:
        text = await _part_text(service, await _part_audio(message["content"][i], where), where)
        message["content"] = [*message["content"][:i], {"type": "text", "text": text}, *message["content"][i + 1:]]
