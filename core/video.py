"""Video clips to still frames, for a vision model: `frames` samples a clip
evenly into a fixed number of PNG images, each no larger than a side cap.

The clip is decoded by Debian's ffmpeg in a subprocess from a temporary
file, held (as core/audio.py holds it) to the one demuxer its first bytes
name and to that one file (`-f`, `-protocol_whitelist file`), within a
time budget. ffprobe reads its duration first, so the frames are spread
over the whole clip; a clip whose container states none is sampled at one
frame a second from its start. Errors never name a server path.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from core import audio, procs

DECODE_TIMEOUT_S = 60.0
CONTAINERS = ("mov", "matroska", "ogg")  # audio.demuxer's that hold video too (mp4, webm, ogv)


class VideoError(ValueError):
    """Bytes that are not a video clip this server can read; the message says why."""


def demuxer(data: bytes) -> str | None:
    head = data[:16]
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    kind = audio.demuxer(data)
    return kind if kind in CONTAINERS else None


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise VideoError(f"{name} is not installed on the server (apt-get install ffmpeg; `make deps` does it)")
    return path


def _duration(kind: str, name: str, timeout_s: float) -> float | None:
    """The clip's length in seconds, as its container states it (None: it does not)."""
    cmd = [_tool("ffprobe"), "-v", "error", "-protocol_whitelist", "file", "-f", kind, "-i", name,
           "-show_entries", "format=duration", "-of", "default=noprint_wrappers=1:nokey=1"]
    try:
        done = procs.run(cmd, hide=procs.SECRET_ENV, capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise VideoError(f"reading the clip took more than {timeout_s:g}s") from None
    try:
        seconds = float(done.stdout.decode().strip().splitlines()[0])
    except (IndexError, ValueError):
        return None
    return seconds if seconds > 0 else None


def frames(data: bytes, count: int, side: int, timeout_s: float = DECODE_TIMEOUT_S) -> list[bytes]:
    """`count` PNG frames spread evenly over the clip (the last repeated when
    the clip holds fewer), each scaled to at most `side` pixels on its long
    side; VideoError for bytes that are not a clip ffmpeg decodes."""
    if not data:
        raise VideoError("the video is empty")
    kind = demuxer(data)
    if kind is None:
        raise VideoError("not a video file this server reads (mp4/mov, webm/mkv, ogv, avi, gif)")
    with tempfile.TemporaryDirectory(prefix="hearth-video-") as work:
        name = os.path.join(work, "clip")
        Path(name).write_bytes(data)
        seconds = _duration(kind, name, timeout_s)
        rate = f"{count}/{seconds:.6f}" if seconds else "1"
        scale = f"scale='min({side},iw)':'min({side},ih)':force_original_aspect_ratio=decrease"
        cmd = [_tool("ffmpeg"), "-nostdin", "-hide_banner", "-loglevel", "error", "-protocol_whitelist", "file",
               "-f", kind, "-i", name, "-an", "-vf", f"fps={rate},{scale}", "-frames:v", str(count),
               "-f", "image2", "-c:v", "png", os.path.join(work, "frame-%03d.png")]
        try:
            done = procs.run(cmd, hide=procs.SECRET_ENV, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise VideoError(f"decoding the clip took more than {timeout_s:g}s") from None
        if done.returncode != 0:
            reason = done.stderr.decode(errors="replace").replace(name, "the clip").strip().splitlines()
            raise VideoError("could not decode the clip" + (f": {reason[-1]}" if reason else ""))
        pictures = [p.read_bytes() for p in sorted(Path(work).glob("frame-*.png"))]
    if not pictures:
        raise VideoError("the clip holds no video frames")
    return (pictures + [pictures[-1]] * count)[:count]
