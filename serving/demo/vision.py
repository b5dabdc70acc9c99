"""Build the demo vision model: a tiny llava (a CLIP-style vision tower, a
projector and a llama) that names the colour and shape of a figure drawn
with Pillow ("a red circle"), trained briefly on the CPU from synthetic
pictures and published to the local HF cache as `hearth/demo-vision`.

The model directory is what mlx-vlm loads (`model_type: llava`, a
`clip_vision_model` tower, a CLIP image processor and a llava processor
config), so serving it exercises the same path as a downloaded llava.
Training runs the mlx-vlm modules themselves; only the merge of image
features into the prompt is written here, batched (mlx-vlm's own merge
takes one prompt at a time).
"""
from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

from core.paths import read_json, read_text
from core.tempdirs import owned_tempdir
from hub.publish import publish_to_cache
from serving.demo.files import CHAT_TEMPLATE, IM_END, PAD, train_tokenizer, write_tokenizer

log = logging.getLogger("hearth.demo")

VISION_REPO = "hearth/demo-vision"
BUILDER_VERSION = 2  # bump when the recipe or the pictures change, so cached builds are redone
MARKER = "hearth_demo.json"
IMAGE_TOKEN = "<image>"
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 215, 20),
           "purple": (140, 40, 180), "orange": (245, 140, 20)}
SHAPES = ("circle", "square", "triangle")
QUESTIONS = ("What is in this picture?", "Describe the image.", "What do you see?", "What shape is this?",
             "Name the colour and the shape.", "What is drawn here?", "")
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class VisionRecipe:
    seed: int = 0
    image_size: int = 32
    patch_size: int = 8
    vision_hidden: int = 64
    vision_layers: int = 2
    hidden: int = 96
    layers: int = 2
    heads: int = 4
    intermediate: int = 192
    vocab_size: int = 320
    context: int = 512
    batch: int = 32
    steps: int = 500
    lr: float = 3e-3
    warmup: int = 20
    images: int = 3000
    feature_strategy: str = "default"  # llava's: "default" drops the tower's CLS token, "full" keeps it


def draw(colour: str, shape: str, rng: random.Random, size: int = 64):
    """A figure of one colour on a grey, slightly varied background, drawn
    at `size` pixels (the processor scales it to the tower's input)."""
    from PIL import Image, ImageDraw

    # A grey near the processor's mean: the background normalizes to about zero, so what the
    # tower sees is the figure (on white, the background dominated every patch and shape was lost).
    grey = tuple(int(255 * m) + rng.randint(-8, 8) for m in CLIP_MEAN)
    img = Image.new("RGB", (size, size), grey)
    d = ImageDraw.Draw(img)
    # In the middle, of one size: a tiny tower learns shape from where the edges fall.
    r = 0.36 * size
    cx = cy = size / 2
    fill = tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in COLOURS[colour])
    if shape == "circle":
        d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "square":
        d.rectangle((cx - r, cy - r, cx + r, cy + r), fill=fill)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r * 0.8), (cx + r, cy + r * 0.8)], fill=fill)
    return img


def answer(colour: str, shape: str) -> str:
    return f"a {colour} {shape}"


def prompt_text(question: str) -> str:
    from serving.demo.build import _template

    content = f"{IMAGE_TOKEN}\n{question}" if question else IMAGE_TOKEN
    return _template().render(messages=[{"role": "user", "content": content}], add_generation_prompt=True)


def configs(recipe: VisionRecipe, vocab: int, image_id: int, eos_id: int) -> tuple[dict, dict, dict]:
    """config.json, preprocessor_config.json and processor_config.json."""
    text = {"model_type": "llama", "hidden_size": recipe.hidden, "num_hidden_layers": recipe.layers,
            "num_attention_heads": recipe.heads, "num_key_value_heads": recipe.heads,
            "intermediate_size": recipe.intermediate, "vocab_size": vocab, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "max_position_embeddings": recipe.context, "tie_word_embeddings": True}
    vision = {"model_type": "clip_vision_model", "hidden_size": recipe.vision_hidden,
              "num_hidden_layers": recipe.vision_layers, "intermediate_size": recipe.vision_hidden * 2,
              "num_attention_heads": 4, "image_size": recipe.image_size, "patch_size": recipe.patch_size,
              "projection_dim": recipe.vision_hidden, "num_channels": 3, "layer_norm_eps": 1e-5}
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "text_config": text,
              "vision_config": vision, "image_token_index": image_id, "vision_feature_layer": -1,
              "vision_feature_select_strategy": recipe.feature_strategy, "vocab_size": vocab, "eos_token_id": eos_id,
              "max_position_embeddings": recipe.context, "torch_dtype": "float32"}
    size = recipe.image_size
    preprocessor = {"image_processor_type": "CLIPImageProcessor", "do_resize": True,
                    "size": {"shortest_edge": size}, "do_center_crop": True,
                    "crop_size": {"height": size, "width": size}, "do_rescale": True, "rescale_factor": 1 / 255,
                    "do_normalize": True, "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD),
                    "do_convert_rgb": True, "resample": 3}
    processor = {"processor_class": "LlavaProcessor", "patch_size": recipe.patch_size,
                 "vision_feature_select_strategy": recipe.feature_strategy, "image_token": IMAGE_TOKEN,
                 "num_additional_image_tokens": 1}
    return config, preprocessor, processor


def cached_snapshot(cache_dir: Path, recipe: VisionRecipe) -> Path | None:
    repo_dir = cache_dir / ("models--" + VISION_REPO.replace("/", "--"))
    try:
        snapshot = repo_dir / "snapshots" / read_text(repo_dir / "refs" / "main", "ref", 4096).strip()
        marker = read_json(snapshot / MARKER, "demo marker")
    except (OSError, ValueError):
        return None
    wanted = {"builder_version": BUILDER_VERSION, "recipe": asdict(recipe)}
    ok = isinstance(marker, dict) and {k: marker.get(k) for k in wanted} == wanted
    return snapshot if ok and (snapshot / "model.safetensors").exists() else None


def _pixels(images, size: int):
    """The CLIP processor's arithmetic (resize, rescale, normalize), channels first."""
    import numpy as np
    from PIL import Image

    out = np.stack([np.asarray(img.resize((size, size), Image.Resampling.BICUBIC), dtype=np.float32) / 255.0
                    for img in images])
    out = (out - np.array(CLIP_MEAN, dtype=np.float32)) / np.array(CLIP_STD, dtype=np.float32)
    return out.transpose(0, 3, 1, 2)


def _dataset(recipe: VisionRecipe, tok, image_id: int, n_image: int):
    """(token rows, loss masks, pixels, labels): each prompt's single image
    token expanded to the tower's `n_image` tokens, the answer after it."""
    rng = random.Random(recipe.seed)
    rows, masks, images, labels = [], [], [], []
    for _ in range(recipe.images):
        colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
        ids = tok.encode(prompt_text(rng.choice(QUESTIONS))).ids
        at = ids.index(image_id)
        ids = ids[:at] + [image_id] * n_image + ids[at + 1:]
        target = tok.encode(answer(colour, shape) + IM_END).ids
        rows.append(ids + target)
        masks.append([0] * len(ids) + [1] * len(target))
        images.append(draw(colour, shape, rng))
        labels.append(answer(colour, shape))
    return rows, masks, _pixels(images, recipe.image_size), labels


def _merge(model, ids, pixels, image_id: int):
    """Prompt embeddings with each row's image features at its image tokens."""
    import mlx.core as mx

    embeds = model.language_model.model.embed_tokens(ids)
    *_, hidden = model.vision_tower(pixels.transpose(0, 2, 3, 1), output_hidden_states=True)
    selected = hidden[model.vision_feature_layer]
    if model.vision_feature_select_strategy == "default":
        selected = selected[:, 1:]
    feats = model.multi_modal_projector(selected)
    is_image = ids == image_id
    index = mx.maximum(mx.cumsum(is_image.astype(mx.int32), axis=1) - 1, 0)
    placed = mx.take_along_axis(feats, index[..., None], axis=1)
    return mx.where(is_image[..., None], placed, embeds)


def _stepper(model, recipe: VisionRecipe, image_id: int):
    """A compiled training step (AdamW on a warmup and cosine schedule, the
    loss on the answer tokens only) and the state it updates."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    schedule = optim.join_schedules([optim.linear_schedule(1e-5, recipe.lr, recipe.warmup),
                                     optim.cosine_decay(recipe.lr, recipe.steps - recipe.warmup, recipe.lr * 0.05)],
                                    [recipe.warmup])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)

    def loss_fn(model, x, m, p):
        h = _merge(model, x[:, :-1], p, image_id)
        logits = model.language_model(x[:, :-1], inputs_embeds=h).logits
        losses = nn.losses.cross_entropy(logits, x[:, 1:], reduction="none")
        return (losses * m[:, 1:]).sum() / m[:, 1:].sum()

    value_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    def step_fn(x, m, p):
        loss, grads = value_and_grad(model, x, m, p)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    return mx.compile(step_fn, inputs=state, outputs=state), state


def train(recipe: VisionRecipe, out: Path, progress=None) -> dict:
    """Train the demo vision model into `out`; returns what was measured."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_vlm.models import llava
    from mlx_vlm.utils import update_module_configs

    texts = [prompt_text(q) + answer(c, s) + IM_END for q in QUESTIONS for c in COLOURS for s in SHAPES]
    tok = train_tokenizer(texts * 4, recipe.vocab_size, markup=False)
    tok.add_special_tokens([IMAGE_TOKEN])
    image_id, pad_id, eos_id = tok.token_to_id(IMAGE_TOKEN), tok.token_to_id(PAD), tok.token_to_id(IM_END)
    # Special tokens train_tokenizer adds, and the image token added just above.
    assert image_id is not None and pad_id is not None and eos_id is not None
    n_image = (recipe.image_size // recipe.patch_size) ** 2 + (recipe.feature_strategy == "full")
    config, preprocessor, processor = configs(recipe, tok.get_vocab_size(), image_id, eos_id)
    mx.random.seed(recipe.seed)
    model_config = update_module_configs(llava.ModelConfig.from_dict(config), llava, config,
                                         ["text", "vision", "projector"])
    model = llava.Model(model_config)
    rows, masks, pixels, labels = _dataset(recipe, tok, image_id, n_image)
    width = max(len(r) for r in rows)
    ids = mx.array([r + [pad_id] * (width - len(r)) for r in rows], dtype=mx.int32)
    loss_mask = mx.array([m + [0] * (width - len(m)) for m in masks], dtype=mx.float32)
    pix = mx.array(pixels)
    held_out = recipe.images // 10  # the last tenth is only evaluated
    step_fn, state = _stepper(model, recipe, image_id)
    order = np.random.default_rng(recipe.seed)
    started, loss_value = time.monotonic(), math.nan
    train_n = recipe.images - held_out
    for step in range(1, recipe.steps + 1):
        pick = mx.array(order.choice(train_n, recipe.batch, replace=False))
        loss = step_fn(ids[pick], loss_mask[pick], pix[pick])
        mx.eval(state, loss)
        loss_value = loss.item()
        if progress and (step % 25 == 0 or step == recipe.steps):
            progress(step, recipe.steps, loss_value, time.monotonic() - started)
    seconds = time.monotonic() - started
    accuracy = _accuracy(model, tok, ids, loss_mask, pix, labels, range(train_n, recipe.images), image_id)
    weights = dict(tree_flatten(model.parameters()))
    _write(out, weights, config, preprocessor, processor, tok, recipe, eos_id, pad_id)
    summary = {"steps": recipe.steps, "final_loss": loss_value, "seconds": round(seconds, 1),
               "held_out_accuracy": accuracy, "held_out": held_out}
    (out / MARKER).write_text(json.dumps({"builder_version": BUILDER_VERSION, "recipe": asdict(recipe),
                                          "trained": summary}))
    return summary


def _accuracy(model, tok, ids, loss_mask, pix, labels, rows, image_id: int) -> float:
    """Greedy answers on held-out pictures (teacher-forced argmax over the
    answer span: every answer token must be right)."""
    import mlx.core as mx

    picked = mx.array(list(rows))
    x, m = ids[picked], loss_mask[picked]
    logits = model.language_model(x[:, :-1], inputs_embeds=_merge(model, x[:, :-1], pix[picked], image_id)).logits
    right = (mx.argmax(logits, axis=-1) == x[:, 1:]) | (m[:, 1:] == 0)
    return round(cast(float, mx.all(right, axis=1).astype(mx.float32).mean().item()), 3)  # a float32 item


def _write(out: Path, weights: dict, config: dict, preprocessor: dict, processor: dict, tok,
           recipe: VisionRecipe, eos_id: int, pad_id: int) -> None:
    import mlx.core as mx

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(out, tok, recipe.context, CHAT_TEMPLATE)
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id, "pad_token_id": pad_id,
                                                            "temperature": 0.0}))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "README.md").write_text(
        "# hearth/demo-vision\n\nA tiny llava built and trained on this machine by `hearth make-demo-model "
        "--kind vision` from synthetic pictures of one coloured figure; it answers with the colour and the "
        "shape (\"a red circle\").\n")


def build(cache_dir: Path, recipe: VisionRecipe = VisionRecipe(), force: bool = False,
          progress=None) -> tuple[Path, bool, dict]:
    """The demo vision snapshot, trained first unless cached; whether a build
    happened; and what the build measured (from its marker)."""
    existing = None if force else cached_snapshot(cache_dir, recipe)
    if existing is None:
        with owned_tempdir("hearth-demo-vision-") as work:
            summary = train(recipe, work, progress)
            log.info("demo vision model trained: %s", summary)
            existing = publish_to_cache(work, VISION_REPO, cache_dir)
        built = True
    else:
        built = False
    marker = read_json(existing / MARKER, "demo marker")
    return existing, built, marker.get("trained", {}) if isinstance(marker, dict) else {}
