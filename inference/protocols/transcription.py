"""OpenAI's audio transcription wire format: the request fields of
`/v1/audio/transcriptions` and `/v1/audio/translations` (multipart or
JSON), and the five response formats (json, text, srt, vtt, verbose_json).

Beside OpenAI's fields (`model` names nothing: the server's Whisper
answers), the contract's own: `vocabulary`, `condition_on_previous_text`,
`no_speech_threshold`, `without_timestamps`, and the voice-activity gate
(`vad`, `vad_threshold`, `vad_min_speech_ms`, `vad_trim`: Silero VAD,
inference/engine/vad.py). `timestamp_granularities` `word` adds word
timestamps; OpenAI's `keywords` are taken as `vocabulary`, and its
`languages` when it names one language. What mlx-whisper cannot do is
refused with a 400 naming the field, never taken and ignored: `beam_size`
above 1 (its decoder has no beam search), OpenAI's `chunking_strategy`,
`include` and speaker fields (`known_speaker_names`,
`known_speaker_references`), `languages` of several languages, and
`stream` with srt or vtt. No Django here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from inference.engine.speech import TEMPERATURES, Options
from inference.engine.vad import Gate
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
    gate: Gate | None = None  # `vad: true`: Whisper runs only on audio with speech in it
    trim: bool = False  # `vad_trim`: the audio cropped to its speech (± TRIM_S) first


def _flag(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise RequestError(f"{name} must be a boolean", name)


def _unit(value, name: str, default):
    """A number in [0, 1] (a form sends it as text), or `default` when not given."""
    if value is None or value == "":
        return default
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise RequestError(f"{name} must be a number in [0, 1]", name) from None
    if isinstance(value, bool) or not math.isfinite(t) or not 0 <= t <= 1:
        raise RequestError(f"{name} must be a number in [0, 1]", name)
    return t


def _languages(fields: dict):
    """`language`, or OpenAI's `languages` (the possible languages) when it names one: Whisper
    detects among all its languages or is told one."""
    many = fields.get("languages")
    if many in (None, "", []):
        return fields.get("language")
    if fields.get("language") not in (None, "") or not isinstance(many, list) or len(many) != 1:
        raise RequestError("languages: Whisper detects the language among all it knows, or is told one; send "
                           "one `language` (or `languages` with one entry), or neither to detect it", "languages")
    return many[0]


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


# What is refused, and why: a field mlx-whisper cannot honour is a 400 naming it.
REFUSED = {
    "chunking_strategy": "the audio is always cut into Whisper's own 30 s windows",
    "include": "mlx-whisper reports no per-token logprobs here",
    "faithful": "there is one decoding path here", "audio_ctx": "the encoder always reads the whole window",
    "known_speaker_names": "there is no speaker diarization here",
    "known_speaker_references": "there is no speaker diarization here",
}
MAX_TERMS = 256  # vocabulary terms (the prompt holds 223 tokens in all)
GRANULARITIES = ("segment", "word")


def _granularities(value, fmt: str) -> bool:
    """Whether word timestamps are asked for (`timestamp_granularities`: a list, or one value)."""
    if value is None or value == "" or value == []:
        return False
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) and v in GRANULARITIES for v in values):
        raise RequestError("timestamp_granularities must hold `segment` and/or `word`", "timestamp_granularities")
    if fmt != "verbose_json":
        raise RequestError("timestamp_granularities needs response_format verbose_json", "timestamp_granularities")
    return "word" in values


def _vocabulary(fields: dict) -> tuple[str, ...]:
    """Recognition hints: a list of terms (JSON) or one comma-separated string (a form), as
    `vocabulary` or OpenAI's `keywords`."""
    value, name = fields.get("vocabulary"), "vocabulary"
    if fields.get("keywords") not in (None, "", []):
        if value not in (None, "", []):
            raise RequestError("send the terms as vocabulary or as keywords, not both", "keywords")
        value, name = fields["keywords"], "keywords"
    if value is None or value == "":
        return ()
    terms = [t.strip() for t in value.split(",")] if isinstance(value, str) else value
    if not isinstance(terms, list) or not all(isinstance(t, str) and t.strip() for t in terms):
        raise RequestError(f"{name} must be a list of terms, or one string of terms separated by commas", name)
    if len(terms) > MAX_TERMS:
        raise RequestError(f"{name} has {len(terms)} terms; at most {MAX_TERMS}", name)
    return tuple(t.strip() for t in terms)


def _beam(value) -> None:
    if value is None or value == "" or str(value) == "1":
        return
    raise RequestError("beam_size: mlx-whisper has no beam search (its decoder is greedy at temperature 0, and "
                       "samples above it); leave it out or send 1", "beam_size")


VAD_SETTINGS = ("vad_threshold", "vad_min_speech_ms", "vad_trim")
MAX_MIN_SPEECH_MS = 60_000


def _gate(fields: dict, live: bool) -> tuple[Gate | None, bool]:
    """The voice-activity gate the `vad*` fields ask for, and whether to trim to the speech."""
    on = _flag(fields.get("vad", False), "vad")
    given = [name for name in VAD_SETTINGS if fields.get(name) not in (None, "", False, "false")]
    if not on:
        if given:
            raise RequestError(f"{given[0]} applies with vad: true (the voice-activity gate)", given[0])
        return None, False
    trim = _flag(fields.get("vad_trim", False), "vad_trim")
    if trim and live:
        raise RequestError("vad_trim is for a whole file: a live take with vad: true already skips its windows "
                           "until speech is heard", "vad_trim")
    min_speech = fields.get("vad_min_speech_ms")
    if min_speech in (None, ""):
        min_speech = Gate.min_speech_ms
    try:
        ms = int(str(min_speech))
    except ValueError:
        ms = -1
    if isinstance(min_speech, bool) or not 0 <= ms <= MAX_MIN_SPEECH_MS:
        raise RequestError(f"vad_min_speech_ms must be a whole number of milliseconds in [0, {MAX_MIN_SPEECH_MS}]",
                           "vad_min_speech_ms")
    return Gate(threshold=_unit(fields.get("vad_threshold"), "vad_threshold", Gate.threshold),
                min_speech_ms=ms), trim


def ask(fields: dict, task: str, formats: tuple[str, ...] = FORMATS, live: bool = False) -> Ask:
    """The request's fields (form values, a list for a repeated one, or a JSON body), checked; `live`:
    a live session's (no `vad_trim`)."""
    for name, why in REFUSED.items():
        if fields.get(name) not in (None, "", False, "false"):
            raise RequestError(f"{name} is not offered: {why}", name)
    fmt = fields.get("response_format") or "json"
    if fmt not in formats:
        raise RequestError(f"response_format must be one of {', '.join(formats)}", "response_format")
    prompt = fields.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise RequestError("prompt must be a string", "prompt")
    stream = _flag(fields.get("stream", False), "stream")
    if stream and fmt in ("srt", "vtt"):
        raise RequestError(f"response_format {fmt} cannot stream: the events carry text and the json body "
                           "(or verbose_json's); ask for srt or vtt without stream", "response_format")
    language = _language(_languages(fields))
    _beam(fields.get("beam_size"))
    options = Options(task=task, language=language, prompt=prompt or None,
                      temperature=_unit(fields.get("temperature"), "temperature", TEMPERATURES),
                      words=_granularities(fields.get("timestamp_granularities"), fmt),
                      condition_on_previous_text=_flag(fields.get("condition_on_previous_text", True),
                                                       "condition_on_previous_text"),
                      no_speech_threshold=_unit(fields.get("no_speech_threshold"), "no_speech_threshold", 0.6),
                      without_timestamps=_flag(fields.get("without_timestamps", False), "without_timestamps"),
                      vocabulary=_vocabulary(fields))
    gate, trim = _gate(fields, live)
    return Ask(options, fmt, stream, gate, trim)


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


def _finite(value):
    """A number JSON can carry: NaN and infinities (an avg_logprob over no finite log-probability) are null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def segment(seg: dict) -> dict:
    out = {k: _finite(seg.get(k)) for k in SEGMENT_FIELDS}
    if "words" in seg:  # word timestamps were asked for
        out["words"] = [{k: _finite(v) for k, v in w.items()} for w in seg["words"]]
    return out


def body(text: str, segments: list[dict], fmt: str, *, task: str, language: str | None, duration: float,
         extra: dict, words: bool = False) -> dict:
    """The JSON response (`json` or `verbose_json`); `extra` is the server's own block (`hearth`). With
    `words`, verbose_json has every word at the top (`words`, OpenAI's place) and in its segment."""
    if fmt != "verbose_json":
        return {"text": text, "hearth": extra}
    out = {"task": "translate" if task == "translate" else "transcribe", "language": language or "",
           "duration": round(duration, 3), "text": text, "segments": [segment(s) for s in segments],
           "hearth": extra}
    if words:
        out["words"] = [{k: _finite(w[k]) for k in ("word", "start", "end")}
                        for s in segments for w in s.get("words", [])]
    return out


def plain(text: str, segments: list[dict], fmt: str) -> str:
    """The bare body of `text`, `srt` or `vtt`."""
    if fmt == "srt":
        return srt(segments)
    if fmt == "vtt":
        return vtt(segments)
    return text + "\n"
