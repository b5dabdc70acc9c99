"""The images of a chat turn on a vision model: each url (data: or
http(s)) read through the remote-media policy (`core.media`), then decoded
and preprocessed by the model's image processor; a video part's clip is
sampled into `chat.VIDEO_FRAMES` stills (`core.video`), at most
`VIDEO_SIDE` pixels on their long side, each then an image. Runs off the
event loop; no MLX call happens here (the engine embeds the pixels)."""
from __future__ import annotations

from core.media import MediaRefused, load_media
from core.video import frames
from inference.engine.errors import InvalidRequest
from inference.engine.vision import Image, Vision
from inference.protocols.chat import VIDEO_FRAMES, MediaRef
from inference.protocols.errors import RequestError

MAX_IMAGES = 16  # images in one request, a video's frames included
VIDEO_SIDE = 448  # pixels on the long side of a video's frames, before the image processor's own resize


def load(refs: list[MediaRef], vision: Vision) -> list[Image]:
    """The images `refs` name, in prompt order (a video's frames in place of
    it); a url that is refused, or is not an image or a clip, is a 400
    naming its part."""
    count = 0
    for ref in refs:
        count += VIDEO_FRAMES if ref.video else 1
        if count > MAX_IMAGES:
            raise RequestError(f"the request has more than {MAX_IMAGES} images (a video counts as its "
                               f"{VIDEO_FRAMES} frames); this server takes at most {MAX_IMAGES}", ref.at)
    images = []
    for ref in refs:
        try:
            if ref.video:
                data, _ = load_media(ref.url, "video")
                images += [vision.prepare(still) for still in frames(data, VIDEO_FRAMES, VIDEO_SIDE)]
            else:
                data, _ = load_media(ref.url, "image")
                images.append(vision.prepare(data))
        except (MediaRefused, ValueError) as exc:  # VideoError included
            what = "video" if ref.video else "image"
            # The message names the part too: Anthropic's error shape has no `param`.
            raise RequestError(f"prompt build failed: {what} url rejected: {ref.at}: {exc}", ref.at) from None
    return images


def expand(tokens: list[int], images: list[Image], vision: Vision) -> tuple[list[int], list[int]]:
    """The prompt with every image's run of image tokens, and its cache key."""
    try:
        return vision.expand(tokens, images)
    except InvalidRequest as exc:
        raise RequestError(str(exc), "messages") from None
