"""Vision-language models: images in the prompt of a served model.

mlx-vlm loads the model (vision tower, projector, language model) and its
image processor. Serving runs the language model as an mlx-lm text model
that shares the VLM's weights, so every lane (continuous batching, the
serial lane, speculation), the samplers, logits processors, grammars and
adapters treat an image request like a text one. What differs is only the
prefill of the prompt's image part:

- A request carries its images (`Image`: the processor's pixels and a hash
  of the bytes) and a prompt in which each image is a run of the model's
  image token (`expand`).
- When the engine admits it, the prompt cache is looked up with the
  request's cache key: the prompt with every image run replaced by ids
  derived from that image's hash (negative, so never a real token), so an
  image is part of the prefix and a different image with the same text
  misses.
- If the image part is not all cached, `prefill` computes the prompt's
  embeddings with mlx-vlm (the tower's features in the image runs) and
  fills the KV cache up to the last prompt token, on the engine thread;
  the lane then starts from that cache like from a prompt-cache hit.

Supported are the model types whose image features take the place of the
image tokens in a plain causal decoder (`SUPPORTED`). `prepare` and
`expand` run on any thread and make no MLX call; `prefill` runs on the
engine thread only.
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from inference.engine.errors import InvalidRequest, ModelLoadError

if TYPE_CHECKING:
    import mlx.nn as nn
    import numpy as np

SUPPORTED = frozenset({"llava"})
MAX_IMAGE_PIXELS = 64 << 20  # a decoded image larger than this is refused (decompression bombs)
# What the image processor may enlarge a picture to before it crops: one that scales the shortest edge up to
# its size makes a strip of 32 x 32M float pixels (12 GB) of a thin picture of 4 x 4M (a 30 kB PNG).
MAX_RESIZED_PIXELS = 16 << 20


@dataclass(frozen=True)
class Image:
    digest: str  # sha256 of the encoded bytes
    pixels: np.ndarray  # what the model's image processor made of it: channels, height, width


def is_vision_config(config: dict) -> bool:
    """A config whose vision tower this module can serve."""
    return bool(config.get("vision_config")) and config.get("model_type") in SUPPORTED


class Vision:
    """The vision side of a served VLM."""

    def __init__(self, vlm: nn.Module, image_processor: Any, image_token_id: int, image_token: str,
                 tokens_per_image: int, model_type: str):
        self.vlm = vlm
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.image_token = image_token  # the text a prompt marks an image with
        self.tokens_per_image = tokens_per_image
        self.model_type = model_type

    # -- any thread, no MLX --------------------------------------------------
    def prepare(self, data: bytes) -> Image:
        """Decode an encoded image (PNG, JPEG, WebP, GIF, BMP, TIFF: what
        Pillow reads) and run the model's image processor on it; raises
        ValueError with the reason for bytes that are not an image."""
        from PIL import Image as PILImage

        try:
            with PILImage.open(io.BytesIO(data)) as opened:
                if opened.width * opened.height > MAX_IMAGE_PIXELS:
                    raise ValueError(f"the image is {opened.width}x{opened.height} pixels; at most "
                                     f"{MAX_IMAGE_PIXELS} pixels are decoded")
                grown = self.grown_pixels(opened.width, opened.height)
                if grown > MAX_RESIZED_PIXELS:
                    raise ValueError(f"the image is {opened.width}x{opened.height} pixels, a shape this model's "
                                     f"image processor would scale to {grown} pixels (at most "
                                     f"{MAX_RESIZED_PIXELS}); crop it closer to a square")
                picture = opened.convert("RGB")
        except PILImage.UnidentifiedImageError:
            raise ValueError("not a readable image: " + ("the image is empty" if not data else
                             "not a format Pillow reads (PNG, JPEG, WebP, GIF, BMP, TIFF)")) from None
        except (OSError, SyntaxError, PILImage.DecompressionBombError) as exc:
            raise ValueError(f"not a readable image ({exc})") from None
        pixels = self.image_processor(images=[picture], return_tensors="np")["pixel_values"][0]
        return Image(hashlib.sha256(data).hexdigest(), pixels)

    def grown_pixels(self, width: int, height: int) -> int:
        """The pixels a `width` x `height` picture grows to when the image
        processor scales its shortest edge up to its size (the aspect kept,
        before any crop); 0 when the processor does not enlarge it."""
        size = getattr(self.image_processor, "size", None)
        edge = size.get("shortest_edge") if isinstance(size, dict) else getattr(size, "shortest_edge", None)
        short = max(1, min(width, height))
        if not getattr(self.image_processor, "do_resize", True) or not isinstance(edge, int) or edge <= short:
            return 0
        return round(width * edge / short) * round(height * edge / short)

    def expand(self, tokens: list[int], images: list[Image]) -> tuple[list[int], list[int]]:
        """The prompt with each image token grown to the tower's run of them,
        and its prompt-cache key. The prompt must mark exactly one place per image."""
        marks = sum(1 for t in tokens if t == self.image_token_id)
        if marks != len(images):
            raise InvalidRequest(f"prompt build failed: the prompt marks {marks} image places "
                                 f"({self.image_token!r}) for {len(images)} images", "messages")
        out: list[int] = []
        key: list[int] = []
        it = iter(images)
        for t in tokens:
            if t != self.image_token_id:
                out.append(t)
                key.append(t)
                continue
            out.extend([t] * self.tokens_per_image)
            key.extend(image_key(next(it).digest, self.tokens_per_image))
        return out, key

    # -- engine thread -------------------------------------------------------
    def prefill(self, text_model: nn.Module, tokens: list[int], images: tuple[Image, ...], cache: list | None,
                start: int, chunk: int = 256) -> tuple[list, int]:
        """Fill `cache` (a fresh one when None) with `tokens[start:-1]` as the
        VLM embeds them, images included; answers the cache and its length."""
        import mlx.core as mx
        import numpy as np
        from mlx_lm.models.cache import make_prompt_cache

        if cache is None:
            cache, start = make_prompt_cache(text_model), 0
        ids = mx.array(tokens)[None]
        pixels = mx.array(np.stack([image.pixels for image in images]))
        embedded = self.vlm.get_input_embeddings(ids, pixels)
        embeds = getattr(embedded, "inputs_embeds", embedded)
        end = len(tokens) - 1
        for at in range(start, end, chunk):
            stop = min(at + chunk, end)
            text_model(ids[:, at:stop], cache=cache, input_embeddings=embeds[:, at:stop])
            mx.eval([c.state for c in cache])
        return cache, max(end, start)


def image_key(digest: str, n: int) -> list[int]:
    """`n` ids standing for one image in prompt-cache keys: negative (no
    token has one), drawn from the image's hash."""
    stream = hashlib.shake_128(bytes.fromhex(digest)).digest(4 * n)
    return [-1 - (int.from_bytes(stream[4 * i:4 * i + 4], "little") & 0x3FFFFFFF) for i in range(n)]


def load_vlm(path: Path) -> nn.Module:
    """The VLM at `path`, as mlx-vlm builds it. Engine thread only."""
    from mlx_vlm.utils import load_model

    try:
        return load_model(path)
    except Exception as exc:
        raise ModelLoadError(f"could not load vision model {path}: {exc}") from exc


def wrap(vlm: nn.Module, path: Path, config: dict) -> tuple[nn.Module, Vision]:
    """An mlx-lm text model on the VLM's language-model weights (shared,
    not copied), and the vision side with the model's image processor."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes
    from mlx_vlm.utils import load_processor

    try:
        processor = load_processor(path, add_detokenizer=False)
    except Exception as exc:
        raise ModelLoadError(f"could not load the image processor of {path}: {exc}") from exc
    text_config = dict(config["text_config"])
    text_config.setdefault("vocab_size", config.get("vocab_size"))
    model_class, args_class = _get_classes(text_config)
    text = model_class(args_class.from_dict(text_config))
    weights = {k.removeprefix("language_model."): v
               for k, v in cast("list[tuple[str, Any]]", tree_flatten(vlm.parameters()))
               if k.startswith("language_model.")}
    if any(k.endswith(".scales") for k in weights):
        quant = config.get("quantization") or {}
        nn.quantize(text, group_size=quant.get("group_size", 64), bits=quant.get("bits", 4),
                    class_predicate=lambda p, m: f"{p}.scales" in weights)
    text.load_weights(list(weights.items()), strict=True)
    image_token = getattr(processor, "image_token", "<image>")
    patch = getattr(processor, "patch_size", None) or config["vision_config"].get("patch_size", 14)
    size = config["vision_config"].get("image_size", 336)
    per_image = (size // patch) ** 2 + int(getattr(processor, "num_additional_image_tokens", 0) or 0)
    if getattr(processor, "vision_feature_select_strategy", "default") == "default":
        per_image -= 1
    vision = Vision(vlm, processor.image_processor, int(config["image_token_index"]), image_token, per_image,
                    str(config.get("model_type")))
    return text, vision
