"""Speech to text over real sockets: `/v1/audio/transcriptions`,
`/v1/audio/translations`, live sessions, the Whisper model's lazy load and
unload, and audio parts in chat, driven by the official openai SDK and httpx.

The server transcribes with an untrained Whisper of the demo's shape (built
here in a second): these tests hold the plumbing — decoding, windows,
formats, streams, sessions, errors — not the words. The audio is real speech
from espeak-ng, the mp3 made from it by ffmpeg.
"""
from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from inference.protocols import transcription
from serving.demo import speech_data
from tests.helpers import ServerProcess, server_env

SRT_CUE = re.compile(r"^\d+\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n", re.M)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("audio")
    speech = speech_data.say("four seven one")
    wav = folder / "digits.wav"
    wav.write_bytes(speech_data.to_wav(np.concatenate([np.zeros(4000, np.float32), speech])))
    mp3 = folder / "digits.mp3"
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-i", str(wav), str(mp3)], check=True)
    return {"wav": wav, "mp3": mp3}


@pytest.fixture(scope="module")
def audio_server(homes, tiny_model, tmp_path_factory):
    """`hearth serve` on the tiny chat model with an untrained Whisper beside it."""
    from serving.demo.whisper_build import write_random

    whisper = write_random(tmp_path_factory.mktemp("whisper") / "tiny-whisper")
    proc = ServerProcess(server_env(*homes), tiny_model, "--whisper-model", str(whisper),
                         "--whisper-idle-unload", "0", "--no-worker",
                         log_path=tmp_path_factory.mktemp("logs") / "audio.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()


@pytest.fixture(scope="module")
def client(audio_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=audio_server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_sdk_transcribes_wav_and_mp3_as_text_and_srt(client, clips):
    for kind in ("wav", "mp3"):
        with open(clips[kind], "rb") as f:
            text = client.audio.transcriptions.create(model="whisper-1", file=f, temperature=0)
        assert isinstance(text.text, str)
        with open(clips[kind], "rb") as f:
            srt = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="srt",
                                                     temperature=0)
        assert isinstance(srt, str)
        assert srt == "" or SRT_CUE.match(srt), srt


def test_verbose_json_segments_and_translation(client, clips):
    with open(clips["wav"], "rb") as f:
        verbose = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                     temperature=0, language="en")
    body = verbose.model_dump()
    assert body["language"] == "en" and body["task"] == "transcribe"
    assert 1.4 < body["duration"] < 3
    for seg in body["segments"]:
        assert set(seg) >= {"id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob",
                            "compression_ratio", "no_speech_prob"}
    with open(clips["wav"], "rb") as f:
        vtt = client.audio.translations.create(model="whisper-1", file=f, response_format="vtt", temperature=0)
    assert vtt.startswith("WEBVTT")


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def test_verbose_json_is_strict_json(audio_server, client, clips):
    """JSON has no NaN or Infinity (JSON.parse refuses a body holding one):
    a segment's number that is not finite (this untrained Whisper's
    avg_logprob is NaN) is null, in the body and in a live session's."""
    nan = {"id": 0, "start": 0.0, "end": 1.0, "text": "4", "avg_logprob": float("nan"),
           "compression_ratio": float("inf"), "words": [{"word": "4", "start": 0.0, "end": 1.0,
                                                         "probability": float("-inf")}]}
    seg = transcription.segment(nan)
    assert seg["avg_logprob"] is None and seg["compression_ratio"] is None
    assert seg["words"][0]["probability"] is None and seg["end"] == 1.0
    r = httpx.post(audio_server.url + "/v1/audio/transcriptions", timeout=120,
                   data={"response_format": "verbose_json", "temperature": "0", "language": "en"},
                   files={"file": ("d.wav", clips["wav"].read_bytes(), "audio/wav")})
    assert r.status_code == 200, r.text
    body = json.loads(r.text, parse_constant=_no_constant)
    assert body["segments"] and all(isinstance(seg["avg_logprob"], float | None) for seg in body["segments"])
    with open(clips["wav"], "rb") as f:  # and the SDK parses it
        assert client.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                  temperature=0).segments


def test_word_timestamps_vocabulary_and_decode_options(client, audio_server, clips):
    with open(clips["wav"], "rb") as f:
        verbose = client.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="verbose_json", temperature=0, language="en",
            timestamp_granularities=["word", "segment"]).model_dump()
    words = [w for seg in verbose["segments"] for w in seg["words"]]  # every segment has its words
    assert [{k: w[k] for k in ("word", "start", "end")} for w in words] == verbose["words"]
    assert all(0 <= w["start"] <= w["end"] <= verbose["duration"] + 0.05 and 0 <= w["probability"] <= 1
               for w in words)
    with open(clips["wav"], "rb") as f:
        plain = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                   temperature=0, language="en").model_dump()
    assert plain.get("words") is None and all("words" not in seg for seg in plain["segments"])

    terms = ["Hearth", "MLX", *(f"term{i}-{'x' * 30}" for i in range(40))]
    data = base64.b64encode(clips["wav"].read_bytes()).decode()
    r = httpx.post(audio_server.url + "/v1/audio/transcriptions", timeout=120, json={
        "file": data, "temperature": 0, "language": "en", "prompt": "Digits, read aloud.", "vocabulary": terms,
        "condition_on_previous_text": False, "no_speech_threshold": 0.4, "without_timestamps": True,
        "beam_size": 1})
    assert r.status_code == 200, r.text
    fitted = r.json()["hearth"]["vocabulary"]
    assert fitted["included"][:2] == ["Hearth", "MLX"] and fitted["omitted"]  # whole terms, in order, to the budget
    assert fitted["included"] + fitted["omitted"] == terms and 0 < fitted["token_count"] <= fitted["token_budget"] < 223
    form = httpx.post(audio_server.url + "/v1/audio/transcriptions", timeout=120, data={"vocabulary": "Hearth, MLX"},
                      files={"file": ("d.wav", clips["wav"].read_bytes(), "audio/wav")})
    assert form.json()["hearth"]["vocabulary"]["included"] == ["Hearth", "MLX"]  # comma-separated in a form


def test_openai_keywords_and_languages_are_taken(client, clips):
    """The SDK's `keywords` are recognition hints (Hearth's `vocabulary`),
    and `languages` with one language tells Whisper the language."""
    with open(clips["wav"], "rb") as f:
        told = client.audio.transcriptions.create(model="whisper-1", file=f, temperature=0, keywords=["Hearth", "MLX"],
                                                  languages=["fr"]).model_dump()
    assert told["hearth"]["vocabulary"]["included"] == ["Hearth", "MLX"]
    assert told["hearth"]["language"] == "fr"


def test_a_field_nothing_reads_is_named_in_a_header(audio_server, client, clips):
    """As on the chat routes, a field that is neither taken nor refused is
    named in X-Hearth-Ignored-Fields, never dropped without a word."""
    for fmt in ("json", "text"):
        with open(clips["wav"], "rb") as f:
            raw = client.audio.transcriptions.with_raw_response.create(
                model="whisper-1", file=f, temperature=0, response_format=fmt,
                extra_body={"speaker_count": "2", "user": "ana"})
        assert raw.headers["x-hearth-ignored-fields"] == "speaker_count"  # `user` is a label: it asks for nothing
    with open(clips["wav"], "rb") as f:
        raw = client.audio.transcriptions.with_raw_response.create(model="whisper-1", file=f, temperature=0,
                                                                  language="en", prompt="Digits.")
    assert "x-hearth-ignored-fields" not in raw.headers
    sessions = audio_server.url + "/v1/audio/sessions"
    opened = httpx.post(sessions, timeout=60, json={"language": "en", "speaker_count": 2})  # a live session's too
    assert opened.status_code == 200 and opened.headers["x-hearth-ignored-fields"] == "speaker_count"
    assert httpx.delete(f"{sessions}/{opened.json()['id']}", timeout=60).status_code == 204


@pytest.mark.parametrize("fields, param, message", [
    ({"beam_size": "5"}, "beam_size", "mlx-whisper has no beam search"),
    ({"vad_threshold": "0.5"}, "vad_threshold", "applies with vad: true"),
    ({"vad": "true", "vad_min_speech_ms": "-5"}, "vad_min_speech_ms", "whole number of milliseconds"),
    ({"vad": "true", "vad_threshold": "1.5"}, "vad_threshold", "in [0, 1]"),
    ({"chunking_strategy": "auto"}, "chunking_strategy", "not offered"),
    ({"include[]": "logprobs"}, "include", "not offered"),
    ({"timestamp_granularities[]": "word"}, "timestamp_granularities", "needs response_format verbose_json"),
    ({"timestamp_granularities[]": "sentence", "response_format": "verbose_json"}, "timestamp_granularities",
     "`segment` and/or `word`"),
    ({"no_speech_threshold": "2"}, "no_speech_threshold", "in [0, 1]"),
    ({"condition_on_previous_text": "maybe"}, "condition_on_previous_text", "must be a boolean"),
    ({"vocabulary": " , "}, "vocabulary", "a list of terms"),
    ({"known_speaker_names[]": "agent"}, "known_speaker_names", "no speaker diarization"),
    ({"known_speaker_references[]": "data:audio/wav;base64,AAAA"}, "known_speaker_references",
     "no speaker diarization"),
    ({"languages[]": ["en", "fr"]}, "languages", "send one `language`"),
    ({"languages[]": "en", "language": "fr"}, "languages", "send one `language`"),
    ({"keywords[]": "Hearth", "vocabulary": "MLX"}, "keywords", "as vocabulary or as keywords, not both"),
    ({"stream": "true", "response_format": "srt"}, "response_format", "srt cannot stream"),
    ({"stream": "true", "response_format": "vtt"}, "response_format", "vtt cannot stream"),
])
def test_transcription_fields_that_cannot_run_are_refused(audio_server, clips, fields, param, message):
    r = httpx.post(audio_server.url + "/v1/audio/transcriptions", timeout=60, data=fields,
                   files={"file": ("d.wav", clips["wav"].read_bytes(), "audio/wav")})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert message in r.json()["error"]["message"]


def test_json_body_and_stream(audio_server, clips):
    data = base64.b64encode(clips["wav"].read_bytes()).decode()
    r = httpx.post(audio_server.url + "/v1/audio/transcriptions", timeout=120,
                   json={"file": "data:audio/wav;base64," + data, "temperature": 0})
    assert r.status_code == 200 and r.json()["hearth"]["timings"]["total_ms"] > 0
    events = []
    with httpx.stream("POST", audio_server.url + "/v1/audio/transcriptions", timeout=120,
                      json={"file": data, "temperature": 0, "stream": True}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "transcript.text.done" and "transcript.progress" in kinds
    assert events[-1]["text"] == "".join(e["delta"] for e in events if e["type"] == "transcript.text.delta").strip()
    assert httpx.get(audio_server.url + "/props").json()["modalities"]["audio"] is True  # a Whisper model beside it


def test_long_audio_goes_in_windows(audio_server, clips):
    """A 65 s take is three windows, each reported as progress."""
    speech = speech_data.say("four seven one")
    take = np.zeros(65 * 16000, np.float32)
    for start in (1, 31, 61):
        take[start * 16000:start * 16000 + len(speech)] = speech
    with httpx.stream("POST", audio_server.url + "/v1/audio/transcriptions", timeout=300,
                      files={"file": ("long.wav", speech_data.to_wav(take), "audio/wav")},
                      data={"stream": "true", "temperature": "0", "language": "en"}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    progress = [e for e in events if e["type"] == "transcript.progress"]
    assert [p["done"] for p in progress] == [3000, 6000, 6500] and progress[-1]["total"] == 6500
    assert events[-1]["hearth"]["duration"] == 65.0


def _stats(server) -> dict:
    return httpx.get(server.url + "/stats").json()["transcription"]


def test_the_voice_activity_gate_keeps_whisper_off_silence(audio_server, clips):
    """`vad: true`: a take without speech is answered without Whisper (not
    even loaded); one with speech says where it is, and `vad_trim` crops
    to it while the timestamps stay the clip's."""
    url = audio_server.url + "/v1/audio/transcriptions"
    httpx.post(audio_server.url + "/admin/transcription/unload", timeout=60)
    loads = _stats(audio_server)["loads"]
    hum = 0.2 * np.sin(2 * np.pi * 220 * np.arange(3 * 16000) / 16000)
    quiet = speech_data.to_wav(np.concatenate([np.zeros(16000), hum]).astype(np.float32))
    for fmt in ("verbose_json", "text"):
        r = httpx.post(url, timeout=60, data={"vad": "true", "response_format": fmt},
                       files={"file": ("quiet.wav", quiet, "audio/wav")})
        assert r.status_code == 200, r.text
        if fmt == "text":
            assert r.text == "\n"
        else:
            body = r.json()
            assert body["text"] == "" and body["segments"] == [] and body["duration"] == 4.0
            assert body["hearth"]["vad"]["speech"] is False and body["hearth"]["vad"]["segments"] == []
    assert _stats(audio_server)["loads"] == loads and not _stats(audio_server)["resident"]  # Whisper never ran

    speech = speech_data.say("four seven one two")
    take = np.zeros(12 * 16000, np.float32)
    take[7 * 16000:7 * 16000 + len(speech)] = speech
    r = httpx.post(url, timeout=120, data={"vad": "true", "vad_trim": "true", "vad_threshold": "0.4",
                                           "response_format": "verbose_json", "temperature": "0"},
                   files={"file": ("late.wav", speech_data.to_wav(take), "audio/wav")})
    assert r.status_code == 200, r.text
    body = r.json()
    ((start, end),) = body["hearth"]["vad"]["segments"]
    assert 6.8 <= start <= 7.2 and end <= 7 + len(speech) / 16000 + 0.2 and body["hearth"]["vad"]["speech"]
    assert body["duration"] == 12.0 and _stats(audio_server)["loads"] == loads + 1
    assert all(seg["start"] >= start - 0.5 - 0.01 for seg in body["segments"])  # placed in the clip, not the crop
    streamed = httpx.post(url, timeout=120, data={"vad": "true", "stream": "true"},
                          files={"file": ("quiet.wav", quiet, "audio/wav")})
    done = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in done] == ["transcript.text.done"] and done[0]["hearth"]["vad"]["speech"] is False


def test_a_client_that_goes_away_stops_its_transcription(audio_server):
    """Its view is cancelled between windows: counted and logged as a 499."""
    take = speech_data.to_wav(np.zeros(150 * 16000, np.float32))  # five windows
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(audio_server.url + "/v1/audio/transcriptions", timeout=httpx.Timeout(60, read=1.5),
                   files={"file": ("long.wav", take, "audio/wav")}, data={"temperature": "0"})
    deadline = time.monotonic() + 30
    while "the client went away" not in audio_server.output() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert re.search(r"POST /v1/audio/transcriptions 499: the client went away", audio_server.output())
    metrics = httpx.get(audio_server.url + "/metrics").text
    assert re.search(r'hearth_http_requests_total\{method="POST",route="v1/audio/transcriptions",status="499"\}',
                     metrics), metrics


def test_bad_requests(audio_server, client):
    url = audio_server.url + "/v1/audio/transcriptions"
    cases = [
        (dict(files={"file": ("x.wav", b"not audio at all", "audio/wav")}), 400),
        (dict(files={"file": ("x.wav", speech_data.to_wav(np.zeros(800, np.float32)), "audio/wav")}), 400),
        (dict(files={"file": ("x.wav", speech_data.to_wav(np.zeros(8000, np.float32)), "audio/wav")},
              data={"response_format": "xml"}), 400),
        (dict(json={"file": "%%%"}), 400),
        (dict(content=b"abc", headers={"content-type": "text/plain"}), 415),
        (dict(content=b"--b--\r\n", headers={"content-type": "multipart/form-data; boundary=b"}), 400),
    ]
    for kwargs, status in cases:
        r = httpx.post(url, timeout=60, **kwargs)
        assert r.status_code == status, (kwargs, r.text)
        assert r.json()["error"]["message"]


def test_live_session(audio_server):
    url = audio_server.url + "/v1/audio/sessions"
    opened = httpx.post(url, json={"language": "en", "temperature": 0}, timeout=60).json()
    sid = opened["id"]
    events: list[dict] = []

    def listen():  # the session's partial and final text as server-sent events, read while chunks arrive
        with httpx.stream("GET", f"{url}/{sid}/events", timeout=300) as stream:
            events.extend(json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: "))

    listener = threading.Thread(target=listen)
    listener.start()
    speech = speech_data.say("four seven one")
    chunk = np.zeros(16 * 16000, np.float32)
    chunk[16000:16000 + len(speech)] = speech
    pcm = {"content-type": "audio/pcm;rate=16000"}
    first = httpx.post(f"{url}/{sid}/audio", content=chunk.tobytes(), headers=pcm, timeout=60).json()
    assert first["samples"] == len(chunk) and first["segments"] == []  # no window complete yet
    second = httpx.post(f"{url}/{sid}/audio", content=chunk.tobytes(), headers=pcm, timeout=120).json()
    assert second["duration"] == 32.0  # the first 30 s window was transcribed on arrival
    wav = httpx.post(f"{url}/{sid}/audio", content=speech_data.to_wav(speech), headers={"content-type": "audio/wav"},
                     timeout=60)
    assert wav.status_code == 200
    done = httpx.post(f"{url}/{sid}/finish", timeout=120)
    assert done.status_code == 200 and isinstance(done.json()["text"], str)
    listener.join(timeout=60)
    assert not listener.is_alive(), "the event stream did not end when the session finished"
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "transcript.text.done" and events[-1]["text"] == done.json()["text"]
    progress = [e["duration"] for e in events if e["type"] == "transcript.progress"]
    assert progress[:2] == [16.0, 32.0]  # a receipt per chunk, as it arrived
    deltas = [e for e in events if e["type"] == "transcript.text.delta"]
    words = "".join(d["delta"] for d in deltas).split()
    assert words == done.json()["text"].split()  # the partial text, piece by piece, is the final text
    assert httpx.post(f"{url}/{sid}/finish", timeout=30).status_code == 409
    assert httpx.post(f"{url}/{sid}/audio", content=b"\0" * 8, headers=pcm, timeout=30).status_code == 409
    assert httpx.delete(f"{url}/{sid}", timeout=30).status_code == 204
    assert httpx.post(f"{url}/{sid}/finish", timeout=30).status_code == 404
    assert httpx.post(f"{url}/nope/audio", content=b"\0" * 8, headers=pcm, timeout=30).status_code == 404


def test_a_live_session_hears_speech_and_with_vad_skips_the_silence(audio_server):
    url = audio_server.url + "/v1/audio/sessions"
    pcm = {"content-type": "audio/pcm;rate=16000"}
    assert httpx.post(url, json={"vad": True, "vad_trim": True}, timeout=60).json()["error"]["param"] == "vad_trim"
    assert httpx.post(url, json={"stream": True}, timeout=60).json()["error"]["param"] == "stream"
    gated = httpx.post(url, json={"vad": True, "temperature": 0}, timeout=60).json()["id"]
    plain = httpx.post(url, json={"temperature": 0}, timeout=60).json()["id"]
    silence = np.zeros(31 * 16000, np.float32)  # completes a window
    for sid in (gated, plain):
        quiet = httpx.post(f"{url}/{sid}/audio", content=silence.tobytes(), headers=pcm, timeout=120).json()
        assert quiet["speech"] is False and quiet["samples"] == len(silence)
    speech = speech_data.say("four seven one")
    heard = httpx.post(f"{url}/{gated}/audio", content=speech.tobytes(), headers=pcm, timeout=60).json()
    assert heard["speech"] is True
    done = httpx.post(f"{url}/{gated}/finish", timeout=120).json()
    ((start, end),) = done["hearth"]["vad"]["segments"]
    assert 30.8 <= start <= 31.2 and done["hearth"]["vad"]["speech"] is True
    assert httpx.post(f"{url}/{plain}/finish", timeout=120).json()["hearth"].get("vad") is None
    # A gated take that never had speech is finished without Whisper.
    empty = httpx.post(url, json={"vad": True}, timeout=60).json()["id"]
    httpx.post(f"{url}/{empty}/audio", content=silence[:16000].tobytes(), headers=pcm, timeout=60)
    nothing = httpx.post(f"{url}/{empty}/finish", timeout=60).json()
    assert nothing["text"] == "" and nothing["hearth"]["vad"] == {**nothing["hearth"]["vad"], "speech": False}


def test_at_most_64_open_sessions(audio_server):
    url = audio_server.url + "/v1/audio/sessions"
    with httpx.Client(timeout=60) as http:
        ids = [http.post(url, json={}).json()["id"] for _ in range(64)]
        refused = http.post(url, json={})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_sessions"
        for sid in ids:
            assert http.delete(f"{url}/{sid}").status_code == 204
        assert http.post(url, json={}).status_code == 200


def test_unload_and_stats(audio_server, client, clips):
    with open(clips["wav"], "rb") as f:
        client.audio.transcriptions.create(model="whisper-1", file=f, temperature=0)
    stats = httpx.get(audio_server.url + "/stats").json()["transcription"]
    assert stats["resident"] and stats["loads"] >= 1 and stats["requests"] >= 1 and stats["idle_unload_sec"] == 0
    out = httpx.post(audio_server.url + "/admin/transcription/unload", timeout=60).json()
    assert out["unloaded"] is True and out["resident"] is False and out["unloads"] == stats["unloads"] + 1
    health = httpx.get(audio_server.url + "/health").json()["transcription"]
    assert health["resident"] is False and "model" not in health  # /health needs no key: no model name
    again = httpx.post(audio_server.url + "/admin/transcription/unload", timeout=60).json()
    assert again["unloaded"] is False
    with open(clips["wav"], "rb") as f:  # loads again on the next use
        client.audio.transcriptions.create(model="whisper-1", file=f, temperature=0)
    assert httpx.get(audio_server.url + "/stats").json()["transcription"]["loads"] == stats["loads"] + 1


def test_audio_parts_in_chat(audio_server, clips):
    data = base64.b64encode(clips["wav"].read_bytes()).decode()
    chat = openai.OpenAI(base_url=audio_server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    for part in ({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
                 {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + data}}):
        r = chat.chat.completions.create(model="m", max_tokens=4, temperature=0, messages=[
            {"role": "user", "content": [{"type": "text", "text": "Say: "}, part]}])
        assert r.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.BadRequestError) as refused:
        chat.chat.completions.create(model="m", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "audio_url", "audio_url": {"url": "http://127.0.0.1:9/clip.wav"}}]}])
    assert "audio_url" in str(refused.value) and "127.0.0.1" in str(refused.value)  # the media policy refused it


def test_without_a_whisper_model(server, clips):
    """The plain test server has none: 503 on the audio routes, a 400 naming it for audio parts in chat."""
    r = httpx.post(server.url + "/v1/audio/transcriptions", timeout=60,
                   files={"file": ("d.wav", clips["wav"].read_bytes(), "audio/wav")})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable"
    assert "--whisper-model" in r.json()["error"]["message"]
    data = base64.b64encode(clips["wav"].read_bytes()).decode()
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={"max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}]})
    assert chat.status_code == 400 and "Whisper" in chat.json()["error"]["message"]


def test_dashboard_hold_to_talk_and_audio_drop(audio_server, clips, tmp_path):
    """The chat's microphone button streams a fake microphone (Chromium plays
    a wav file as the capture device) to a live session and fills the prompt;
    an audio file dropped on the chat is transcribed into it too."""
    import shutil

    from playwright.sync_api import sync_playwright

    from tests.helpers import ARTIFACTS

    looped = tmp_path / "mic.wav"  # Chromium loops the file: speech, then a second of silence
    speech = speech_data.say("four seven one")
    looped.write_bytes(speech_data.to_wav(np.concatenate([np.zeros(8000, np.float32), speech,
                                                          np.zeros(16000, np.float32)])))
    args = ["--no-sandbox", "--disable-gpu", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={looped}"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=args)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(audio_server.url + "/#/chat")
            mic = page.get_by_role("button", name="Hold to talk")
            mic.wait_for(state="visible", timeout=30_000)
            box = mic.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            with page.expect_response(lambda r: r.url.endswith("/finish"), timeout=120_000) as finished:
                page.mouse.down()
                page.wait_for_function("document.querySelector('.mic').classList.contains('recording')")
                page.wait_for_timeout(2500)
                page.screenshot(path=str(ARTIFACTS / "audio-mic-recording.png"))
                page.mouse.up()
            assert finished.value.status == 200
            text = finished.value.json()["text"]
            if text.strip():
                page.wait_for_function("document.querySelector('textarea[aria-label=Message]').value.length > 0")
                assert page.locator("textarea[aria-label=Message]").input_value().strip() == text.strip()
            page.screenshot(path=str(ARTIFACTS / "audio-mic-filled.png"))
            # A dropped file: the same clip as an upload to /v1/audio/transcriptions.
            data = list(clips["wav"].read_bytes())
            with page.expect_response(lambda r: r.url.endswith("/v1/audio/transcriptions"), timeout=120_000) as up:
                page.evaluate("""(bytes) => {
                    const file = new File([new Uint8Array(bytes)], 'clip.wav', { type: 'audio/wav' });
                    const dt = new DataTransfer(); dt.items.add(file);
                    const chat = document.querySelector('.chat');
                    const init = { dataTransfer: dt, bubbles: true, cancelable: true };
                    chat.dispatchEvent(new DragEvent('dragover', init));
                    chat.dispatchEvent(new DragEvent('drop', init));
                }""", data)
            assert up.value.status == 200
        finally:
            browser.close()


def test_idle_unload(monkeypatch):
    """The Whisper model goes after `idle_unload_s` without use, and comes back on the next."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from inference.engine import speech

    weights = object()
    monkeypatch.setattr(speech, "load", lambda ref: weights)
    with ThreadPoolExecutor(1) as engine_thread:
        service = speech.Transcriber("some/whisper", engine_thread.submit, idle_unload_s=0.3)
        assert service.submit(lambda model: model is weights).result(5)[0] is True
        assert service.resident and service.loads == 1
        time.sleep(1.0)
        assert not service.resident and service.unloads == 1
        _, load_ms = service.submit(lambda model: None).result(5)
        assert service.resident and service.loads == 2 and load_ms >= 0
        service.close()
    assert speech.Transcriber(None, engine_thread.submit).stats()["model"] is None


def test_the_default_whisper_is_the_first_in_the_library_the_demos_last(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from hearth.management.commands.serve import first_whisper
    from hub.publish import publish_to_cache
    from serving.demo.whisper_build import WHISPER_REPO

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert first_whisper() is None
    configs = {WHISPER_REPO: {"model_type": "whisper", "n_mels": 80},
               "org/whisper-small": {"model_type": "whisper", "n_mels": 80},
               "org/a-chat-model": {"model_type": "llama"},
               "org/hf-whisper": {"model_type": "whisper", "num_mel_bins": 80}}  # transformers' layout: not ours
    for repo, config in configs.items():
        folder = tmp_path / "src" / repo.replace("/", "--")
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config))
        publish_to_cache(folder, repo, cache_dir=tmp_path)
        if repo == WHISPER_REPO:
            assert first_whisper() == WHISPER_REPO  # the demo's, while it is the only one
    assert first_whisper() == "org/whisper-small"
