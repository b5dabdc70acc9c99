"""The prefill cost of one image: how long a vision model takes to read a
picture before its first token, beside a text prompt of the same length.

    python bench/vision.py [--model REPO_OR_DIR] [--runs 5] [--record]

Runs in one process on the engine's own code (loader, vision.prepare,
vision.prefill), on the demo vision model by default (`hearth
make-demo-model --kind vision` first), or with `--model clip-b` on a random
llava with a ViT-B/16-sized CLIP tower (224 px, 196 image tokens) and a
small llama, built in a temporary folder. Preload a BLAS as `hearth` does
(LD_PRELOAD) for numbers comparable with the server's.
"""
from __future__ import annotations

import argparse
import io
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode import commit_label  # noqa: E402


def clip_b_model(out: Path) -> Path:
    """A random llava: CLIP ViT-B/16 tower at 224 px, a 4-layer 512-wide llama."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models import llava
    from mlx_vlm.utils import update_module_configs

    from serving.demo import vision
    from serving.demo.files import train_tokenizer, write_tokenizer

    tok = train_tokenizer(["a red circle, a blue square"] * 20, 300, markup=False)
    tok.add_special_tokens([vision.IMAGE_TOKEN])
    recipe = vision.VisionRecipe(image_size=224, patch_size=16, vision_hidden=768, vision_layers=12,
                                 hidden=512, layers=4, heads=8, intermediate=1376, context=2048)
    config, pre, proc = vision.configs(recipe, tok.get_vocab_size(), tok.token_to_id(vision.IMAGE_TOKEN),
                                       tok.token_to_id(vision.IM_END))
    config["vision_config"].update(num_attention_heads=12, intermediate_size=3072)
    model = llava.Model(update_module_configs(llava.ModelConfig.from_dict(config), llava, config,
                                              ["text", "vision", "projector"]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    (out / "preprocessor_config.json").write_text(json.dumps(pre))
    (out / "processor_config.json").write_text(json.dumps(proc))
    write_tokenizer(out, tok, recipe.context)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return out


def measure(ref: str, runs: int) -> dict:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from inference.engine import loader
    from serving.demo.vision import draw, prompt_text

    model = loader.load(ref)
    vision = model.vision
    assert vision is not None, f"{ref} is not a vision model"
    buf = io.BytesIO()
    draw("red", "circle", random.Random(0), size=256).save(buf, "PNG")
    text = model.tokenizer.encode(prompt_text("What is in this picture?"), add_special_tokens=False)
    prepare, image, plain = [], [], []
    for _ in range(runs + 1):  # the first run warms up
        t0 = time.perf_counter()
        picture = vision.prepare(buf.getvalue())
        t1 = time.perf_counter()
        tokens, _ = vision.expand(text, [picture])
        vision.prefill(model.model, tokens, (picture,), None, 0)
        t2 = time.perf_counter()
        cache = make_prompt_cache(model.model)
        model.model(mx.array(tokens[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
        t3 = time.perf_counter()
        prepare.append(t1 - t0)
        image.append(t2 - t1)
        plain.append(t3 - t2)
    ms = lambda xs: round(statistics.median(xs[1:]) * 1000, 1)  # noqa: E731
    return {"model": ref, "image_tokens": vision.tokens_per_image, "prompt_tokens": len(tokens),
            "prepare_ms": ms(prepare), "image_prefill_ms": ms(image), "text_prefill_ms": ms(plain),
            "dtype": model.dtype}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hearth/demo-vision")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ref = str(clip_b_model(Path(tmp) / "clip-b")) if args.model == "clip-b" else args.model
        row = measure(ref, args.runs)
    row["model"] = args.model
    print(json.dumps(row))
    if args.record:
        import os

        machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"
        section = (f"\n## {time.strftime('%Y-%m-%d')} · image prefill · commit {commit_label()}\n\n"
                   f"`python bench/vision.py --model {args.model} --runs {args.runs} --record` on {machine}; "
                   f"median of {args.runs}.\n\n"
                   "| model | image tokens | prompt tokens | decode + preprocess ms | prefill with image ms "
                   "| same-length text prefill ms |\n| --- | ---: | ---: | ---: | ---: | ---: |\n"
                   f"| {args.model} | {row['image_tokens']} | {row['prompt_tokens']} | {row['prepare_ms']} "
                   f"| {row['image_prefill_ms']} | {row['text_prefill_ms']} |\n")
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(section)


if __name__ == "__main__":
    main()
