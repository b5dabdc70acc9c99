"""What decoding audio may cost (core/audio.py), in this process with
Debian's ffmpeg: a small file of a long silence is decoded no further than
`max_audio_seconds` and refused, ffmpeg reads only the container the bytes
start with and only the one uploaded file (a concat list is no audio), and
no error names a server path."""
from __future__ import annotations

import dataclasses
import io
import subprocess
import time
import wave

import numpy as np
import pytest

from core import audio, limits


@pytest.fixture
def cap(monkeypatch):
    def set_cap(seconds: float) -> None:
        monkeypatch.setattr(limits, "_current", dataclasses.replace(limits.DEFAULT, max_audio_seconds=seconds))
    return set_cap


def _silence(seconds: float, codec: str, container: str) -> bytes:
    return subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-f", "lavfi", "-i",
                           "anullsrc=r=16000:cl=mono", "-t", str(seconds), "-c:a", codec, "-f", container, "pipe:1"],
                          check=True, capture_output=True).stdout


def _wav(seconds: float) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))
    return out.getvalue()


def test_a_long_silence_in_a_small_file_is_refused_without_decoding_it_whole(cap):
    cap(60)
    bomb = _silence(3600, "flac", "flac")  # an hour of silence
    assert len(bomb) < 2 << 20
    started = time.monotonic()
    with pytest.raises(audio.AudioTooLong, match="longer than 60 s"):
        audio.decode(bomb)
    assert time.monotonic() - started < 20  # an hour decoded whole took many times longer
    assert len(audio.decode(_silence(59, "flac", "flac"))) == 59 * 16000  # within the cap: all of it


def test_each_container_is_read_by_its_own_demuxer(cap):
    cap(60)
    for data, kind in ((_wav(1), "wav"), (_silence(1, "flac", "flac"), "flac"), (_silence(1, "libopus", "ogg"), "ogg"),
                       (_silence(1, "libmp3lame", "mp3"), "mp3")):
        assert audio.demuxer(data) == kind
        assert abs(len(audio.decode(data)) - 16000) < 2000, kind


def test_a_concat_list_or_other_bytes_are_no_audio_and_errors_name_no_path(tmp_path, cap):
    cap(60)
    secret = tmp_path / "private.wav"
    secret.write_bytes(_wav(1))
    for data in (f"ffconcat version 1.0\nfile '{secret}'\n".encode(), b"#EXTM3U\n" + str(secret).encode(),
                 b"not audio at all"):
        with pytest.raises(audio.AudioError) as refused:
            audio.decode(data)
        assert str(tmp_path) not in str(refused.value) and "/tmp" not in str(refused.value), refused.value
    broken = _wav(1)[:44] + b"\xff" * 10  # a wav header over no frames
    with pytest.raises(audio.AudioError) as refused:
        audio.decode(b"RIFF" + broken[4:8] + b"WAVEjunk" + bytes(64))
    assert "hearth-audio" not in str(refused.value) and "/tmp" not in str(refused.value)


def test_raw_pcm_is_capped_too(cap):
    cap(2)
    assert len(audio.pcm(np.zeros(32000, "<f4").tobytes())) == 32000
    with pytest.raises(audio.AudioTooLong):
        audio.pcm(np.zeros(32001, "<f4").tobytes())
