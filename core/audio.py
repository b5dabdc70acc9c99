"""Audio bytes to Whisper's input: 16 kHz mono float32 samples.

Any container ffmpeg reads (wav, mp3, m4a, flac, ogg, webm, mp4 audio
tracks…) is decoded by Debian's ffmpeg in a subprocess from a temporary
file (some containers keep their index at the end and cannot be read from
a pipe). Raw little-endian float32 PCM at 16 kHz (`audio/pcm;rate=16000`,
what the dashboard's microphone sends) is taken as it is.
"""
from __future__ import annotations

import base64
import binascii
import os
import shutil
import subprocess
import tempfile

import numpy as np

from core import procs

RATE = 16000
DECODE_TIMEOUT_S = 120.0


class AudioError(ValueError):
    """Bytes that are not audio this server can decode; the message says why."""


def ffmpeg() -> str:
    path = shutil.which("ffmpeg")
    if path is None:
        raise AudioError("ffmpeg is not installed on the server (apt-get install ffmpeg; `make deps` does it)")
    return path


def decode(data: bytes, timeout_s: float = DECODE_TIMEOUT_S) -> np.ndarray:
    """Any container ffmpeg reads -> 16 kHz mono float32 (channels mixed, rate converted)."""
    if not data:
        raise AudioError("the audio file is empty")
    fd, name = tempfile.mkstemp(prefix="hearth-audio-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        cmd = [ffmpeg(), "-nostdin", "-hide_banner", "-loglevel", "error", "-i", name, "-vn",
               "-f", "f32le", "-acodec", "pcm_f32le", "-ac", "1", "-ar", str(RATE), "pipe:1"]
        try:
            done = procs.run(cmd, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AudioError(f"decoding the audio took more than {timeout_s:g}s") from None
    finally:
        os.unlink(name)
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip().splitlines()
        raise AudioError("could not decode the audio" + (f": {reason[-1]}" if reason else ""))
    if not done.stdout:
        raise AudioError("the file holds no audio stream")
    return np.frombuffer(done.stdout, "<f4").copy()


def pcm(data: bytes) -> np.ndarray:
    """Raw little-endian float32 mono samples."""
    if len(data) % 4:
        raise AudioError("raw PCM must be little-endian float32: the byte count is not a multiple of 4")
    samples = np.frombuffer(data, "<f4").astype(np.float32)
    if not np.all(np.isfinite(samples)):
        raise AudioError("raw PCM holds NaN or infinite samples")
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
