"""OpenAI's audio transcription wire format: the request fields of
`/v1/audio/transcriptions` and `/v1/audio/translations` (multipart or
JSON), and the five response formats (json, text, srt, vtt, verbose_json).

Fields this server does not implement (`timestamp_granularities`,
`beam_size`, `vocabulary`, `vad*`, …) are ignored, as OpenAI ignores
unknown fields. No Django here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from inference.engine.speech import TEMPERATURES, Options
from inference.protocols.errors import RequestError

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
CONTENT_TYPES = {"text": "text/plain; charset=utf-8", "srt": "application/x-subrip; charset=utf-8",
                 "vtt": "text/vtt; charset=utf-8"}
AUDIO_ALIASES = ("file", "input_audio", "audio")  # JSON bodies may name the audio any of these ways


@dataclass(frozen=True)
class Ask:
    options: Options
    response_format: str = "json"
    stream: bool = False


def _flag(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise RequestError(f"{name} must be a boolean", name)


def _temperature(value) -> float | tuple[float, ...]:
    if value is None or value == "":
        return TEMPERATURES
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise RequestError("temperature must be a number in [0, 1]", "temperature") from None
    if isinstance(value, bool) or not math.isfinite(t) or not 0 <= t <= 1:
        raise RequestError("temperature must be a number in [0, 1]", "temperature")
    return t


def _language(value) -> str | None:
    if value is None or value == "" or value == "auto":
        return None
    from mlx_whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    if not isinstance(value, str):
        raise RequestError("language must be a string (an ISO 639-1 code such as `en`)", "language")
    code = value.strip().lower()
    code = TO_LANGUAGE_CODE.get(code, code)
    if code not in LANGUAGES:
        raise RequestError(f"unsupported language {value!r}", "language")
    return code


def ask(fields: dict, task: str, formats: tuple[str, ...] = FORMATS) -> Ask:
    """The request's fields (form values or a JSON body), checked."""
    fmt = fields.get("response_format") or "json"
    if fmt not in formats:
        raise RequestError(f"response_format must be one of {', '.join(formats)}", "response_format")
    prompt = fields.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise RequestError("prompt must be a string", "prompt")
    stream = _flag(fields.get("stream", False), "stream")
    language = _language(fields.get("language"))
    options = Options(task=task, language=language, prompt=prompt or None,
                      temperature=_temperature(fields.get("temperature")))
    return Ask(options, fmt, stream)


def stamp(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(segments: list[dict]) -> str:
    blocks = [f"{i}\n{stamp(s['start'], ',')} --> {stamp(s['end'], ',')}\n{s['text'].strip()}\n"
              for i, s in enumerate(segments, 1)]
    return "\n".join(blocks)


def vtt(segments: list[dict]) -> str:
    cues = [f"{stamp(s['start'], '.')} --> {stamp(s['end'], '.')}\n{s['text'].strip()}\n" for s in segments]
    return "WEBVTT\n\n" + "\n".join(cues)


SEGMENT_FIELDS = ("id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob",
                  "compression_ratio", "no_speech_prob")


def segment(seg: dict) -> dict:
    return {k: seg.get(k) for k in SEGMENT_FIELDS}


def body(text: str, segments: list[dict], fmt: str, *, task: str, language: str | None, duration: float,
         extra: dict) -> dict:
    """The JSON response (`json` or `verbose_json`); `extra` is the server's own block (`hearth`)."""
    if fmt != "verbose_json":
        return {"text": text, "hearth": extra}
    return {"task": "translate" if task == "translate" else "transcribe", "language": language or "",
            "duration": round(duration, 3), "text": text, "segments": [segment(s) for s in segments],
            "hearth": extra}


def plain(text: str, segments: list[dict], fmt: str) -> str:
    """The bare body of `text`, `srt` or `vtt`."""
    if fmt == "srt":
        return srt(segments)
    if fmt == "vtt":
        return vtt(segments)
    return text + "\n"
