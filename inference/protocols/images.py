"""The images of a chat turn on a vision model: each url (data: or
http(s)) read through the remote-media policy (`core.media`), then decoded
and preprocessed by the model's image processor. Runs off the event loop;
no MLX call happens here (the engine embeds the pixels)."""
from __future__ import annotations

from core.media import MediaRefused, load_media
from inference.engine.errors import InvalidRequest
from inference.engine.vision import Image, Vision
from inference.protocols.errors import RequestError

MAX_IMAGES = 16  # images in one request


def load(refs: list[tuple[str, str]], vision: Vision) -> list[Image]:
    """The images `refs` ((url, field path) in prompt order) name; a url
    that is refused or is not an image is a 400 naming its part."""
    if len(refs) > MAX_IMAGES:
        raise RequestError(f"the request has {len(refs)} images; this server takes at most {MAX_IMAGES}",
                           refs[MAX_IMAGES][1])
    images = []
    for url, where in refs:
        try:
            data, _ = load_media(url, "image")
            images.append(vision.prepare(data))
        except (MediaRefused, ValueError) as exc:
            raise RequestError(f"prompt build failed: image url rejected: {exc}", where) from None
    return images


def expand(tokens: list[int], images: list[Image], vision: Vision) -> tuple[list[int], list[int]]:
    """The prompt with every image's run of image tokens, and its cache key."""
    try:
        return vision.expand(tokens, images)
    except InvalidRequest as exc:
        raise RequestError(str(exc), "messages") from None
