"""Video parts (`video_url`) on a vision model, in-process: a clip is
sampled by ffmpeg into `chat.VIDEO_FRAMES` stills spread over its length
(core/video.py), each then an image of the prompt, under the same media
policy and image cap; refusals name the part. The model is a llava built
here from a fixed seed with two training steps (random weights in effect;
tests/protocols/conftest.py): what is checked is the pipeline, not what the
model says (the demo vision model's checks are tests/demo)."""
from __future__ import annotations

import base64
import io
import subprocess

import pytest

from core import video
from inference.protocols.chat import VIDEO_FRAMES


def clip(path, *colours: str, seconds: float = 1.0, codec: str = "mpeg4") -> bytes:
    """A clip that shows each colour in turn, `seconds` each, made by ffmpeg."""
    inputs: list[str] = []
    for colour in colours:
        inputs += ["-f", "lavfi", "-i", f"color=c={colour}:s=64x48:d={seconds}:r=10"]
    joined = "".join(f"[{i}:v]" for i in range(len(colours))) + f"concat=n={len(colours)}:v=1[v]"
    subprocess.run(["ffmpeg", "-v", "error", "-y", *inputs, "-filter_complex", joined, "-map", "[v]",
                    "-c:v", codec, str(path)], check=True, timeout=60)
    return path.read_bytes()


def data_url(data: bytes, kind: str = "video/mp4") -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode()


def test_frames_are_spread_over_the_clip_and_capped_in_size(tmp_path):
    from PIL import Image

    data = clip(tmp_path / "a.mp4", "red", "blue", seconds=1.0)
    stills = video.frames(data, 8, 32)
    assert len(stills) == 8
    pictures = [Image.open(io.BytesIO(s)).convert("RGB") for s in stills]
    assert all(max(p.size) <= 32 for p in pictures) and pictures[0].size == (32, 24)  # the aspect kept
    first, last = pictures[0].getpixel((10, 10)), pictures[-1].getpixel((10, 10))
    assert first[0] > 200 and first[2] < 60 and last[2] > 200 and last[0] < 60  # red at the start, blue at the end
    gif = clip(tmp_path / "b.gif", "green", seconds=0.2, codec="gif")
    assert len(video.frames(gif, 8, 32)) == 8  # a clip of two frames, the last repeated
    with pytest.raises(video.VideoError, match="not a video file"):
        video.frames(b"RIFF....WAVEfmt ", 8, 32)
    with pytest.raises(video.VideoError, match="could not decode the clip"):
        video.frames(data[:200], 8, 32)


@pytest.fixture(scope="module")
def app(served, vision_model):
    return served("--no-worker", model=vision_model)


def _ask(app, *parts: dict):
    return app.post("/v1/chat/completions", json={"max_tokens": 3, "temperature": 0, "messages": [
        {"role": "user", "content": [*parts, {"type": "text", "text": "What colour?"}]}]})


def test_a_clip_is_its_frames_in_the_prompt(app, tmp_path):
    data = clip(tmp_path / "c.mp4", "red", "blue")
    as_video = _ask(app, {"type": "video_url", "video_url": {"url": data_url(data)}})
    assert as_video.status_code == 200, as_video.text
    stills = video.frames(data, VIDEO_FRAMES, 448)
    as_images = _ask(app, *[{"type": "image_url", "image_url": {"url": data_url(s, "image/png")}} for s in stills])
    assert as_images.status_code == 200, as_images.text
    # The same eight stills in the same places: the same prompt, to the token.
    assert as_video.json()["usage"]["prompt_tokens"] == as_images.json()["usage"]["prompt_tokens"]
    one = _ask(app, {"type": "image_url", "image_url": {"url": data_url(stills[0], "image/png")}}).json()
    per_image = (as_images.json()["usage"]["prompt_tokens"] - one["usage"]["prompt_tokens"]) // (VIDEO_FRAMES - 1)
    assert per_image > 1  # each still is a run of image tokens, not one marker
    alias = _ask(app, {"type": "video", "url": data_url(data)})  # the `video` alias
    assert alias.status_code == 200
    assert alias.json()["usage"]["prompt_tokens"] == as_video.json()["usage"]["prompt_tokens"]
    raw = _ask(app, {"type": "video", "data": base64.b64encode(data).decode()})  # the alias with base64 bytes
    assert raw.status_code == 200, raw.text
    assert raw.json()["usage"]["prompt_tokens"] == as_video.json()["usage"]["prompt_tokens"]


def test_video_refusals_name_the_part(app, tiny_model, served, tmp_path):
    data = clip(tmp_path / "d.mp4", "green")
    bad = _ask(app, {"type": "video_url", "video_url": {"url": data_url(b"not a clip at all")}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages[0].content[0]"
    assert bad.json()["error"]["message"].startswith("prompt build failed: video url rejected: "
                                                     "messages[0].content[0]: not a video file")
    part = {"type": "video_url", "video_url": {"url": data_url(data)}}
    image = {"type": "image_url", "image_url": {"url": data_url(video.frames(data, 1, 32)[0], "image/png")}}
    many = _ask(app, part, part, image)  # 8 + 8 + 1 images: over the cap of 16
    assert many.status_code == 400 and many.json()["error"]["param"] == "messages[0].content[2]"
    assert "more than 16 images (a video counts as its 8 frames)" in many.json()["error"]["message"]
    empty = _ask(app, {"type": "video_url", "video_url": {}})
    assert empty.status_code == 400 and "needs a clip: video_url.url" in empty.json()["error"]["message"]
    text_only = served("--no-worker")  # the tiny text model
    refused = _ask(text_only, part)
    assert refused.status_code == 400 and "video input needs a vision model" in refused.json()["error"]["message"]
