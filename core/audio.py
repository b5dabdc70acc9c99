"""Audio bytes to Whisper's input: 16 kHz mono float32 samples.

The containers people send (wav, mp3, m4a/mp4, flac, ogg, webm, aac) are
decoded by Debian's ffmpeg in a subprocess from a temporary file (some
containers keep their index at the end and cannot be read from a pipe).
The container is told from the file's first bytes and ffmpeg is held to
that one demuxer and to that one file (`-f`, `-protocol_whitelist file`):
a playlist or concat list never makes it open anything else. Decoding
stops at `limits.max_audio_seconds`: a small file of hours of silence is
refused, not decoded whole. Errors never name a server path. Raw
little-endian float32 PCM at 16 kHz (`audio/pcm;rate=16000`, what the
dashboard's microphone sends) is taken as it is.
"""
from __future__ import annotations

import base64
import binascii
import os
import shutil
import subprocess
import tempfile

import numpy as np

from core import limits, procs

RATE = 16000
DECODE_TIMEOUT_S = 120.0


class AudioError(ValueError):
    """Bytes that are not audio this server can decode; the message says why."""


class AudioTooLong(AudioError):
    """Audio longer than `limits.max_audio_seconds`."""


def too_long(seconds: float) -> AudioTooLong:
    cap = limits.current().max_audio_seconds
    return AudioTooLong(f"the audio is longer than {cap:g} s ({seconds:g} s or more; "
                        "--max-audio-seconds / HEARTH_MAX_AUDIO_SECONDS)")


# ffmpeg's demuxer for each container, told by the file's first bytes.
def demuxer(data: bytes) -> str | None:
    head = data[:16]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"  # webm too
    if head[4:8] == b"ftyp":
        return "mov"  # mp4, m4a
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "aac" if len(head) > 1 and head[1] & 0xF6 == 0xF0 else "mp3"  # ADTS or an MPEG audio frame
    return None


def ffmpeg() -> str:
    path = shutil.which("ffmpeg")
    if path is None:
        raise AudioError("ffmpeg is not installed on the server (apt-get install ffmpeg; `make deps` does it)")
    return path


def decode(data: bytes, timeout_s: float = DECODE_TIMEOUT_S) -> np.ndarray:
    """A container of `demuxer`'s -> 16 kHz mono float32 (channels mixed, rate
    converted), at most `limits.max_audio_seconds` of it (AudioTooLong past it)."""
    if not data:
        raise AudioError("the audio file is empty")
    kind = demuxer(data)
    if kind is None:
        raise AudioError("not an audio file this server reads (wav, mp3, m4a/mp4, flac, ogg, webm, aac, aiff)")
    cap = limits.current().max_audio_seconds
    fd, name = tempfile.mkstemp(prefix="hearth-audio-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # One sample past the cap is decoded, so that audio longer than it is told from audio as long.
        cmd = [ffmpeg(), "-nostdin", "-hide_banner", "-loglevel", "error", "-protocol_whitelist", "file",
               "-f", kind, "-i", name, "-vn", "-t", f"{cap + 1 / RATE:.6f}",
               "-f", "f32le", "-acodec", "pcm_f32le", "-ac", "1", "-ar", str(RATE), "pipe:1"]
        try:
            done = procs.run(cmd, hide=procs.SECRET_ENV, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AudioError(f"decoding the audio took more than {timeout_s:g}s") from None
    finally:
        os.unlink(name)
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").replace(name, "the audio").strip().splitlines()
        raise AudioError("could not decode the audio" + (f": {reason[-1]}" if reason else ""))
    if not done.stdout:
        raise AudioError("the file holds no audio stream")
    samples = np.frombuffer(done.stdout, "<f4").copy()
    if len(samples) > cap * RATE:
        raise too_long(cap)
    return samples


def pcm(data: bytes) -> np.ndarray:
    """Raw little-endian float32 mono samples."""
    if len(data) % 4:
        raise AudioError("raw PCM must be little-endian float32: the byte count is not a multiple of 4")
    samples = np.frombuffer(data, "<f4").astype(np.float32)
    if not np.all(np.isfinite(samples)):
        raise AudioError("raw PCM holds NaN or infinite samples")
    if len(samples) > limits.current().max_audio_seconds * RATE:
        raise too_long(len(samples) / RATE)
    return samples


def pcm_rate(content_type: str) -> int | None:
    """The rate of an `audio/pcm;rate=N` content type, or None when it is another type."""
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() not in ("audio/pcm", "audio/l32", "audio/x-pcm-f32le"):
        return None
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "rate":
            try:
                return int(value.strip())
            except ValueError:
                raise AudioError(f"bad PCM rate {value.strip()!r}") from None
    return RATE


def from_base64(value: str) -> bytes:
    """Base64 or a `data:` URL (`data:audio/wav;base64,…`) -> bytes."""
    text = value.strip()
    if text.startswith("data:"):
        head, sep, text = text.partition(",")
        if not sep or ";base64" not in head:
            raise AudioError("a data: URL for audio must be base64 (data:audio/…;base64,…)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AudioError("the audio is not valid base64") from None
