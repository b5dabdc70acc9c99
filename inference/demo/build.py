"""Build the embedded demo model: a small llama with its own BPE tokenizer,
trained briefly on the CPU on the synthetic chat corpus, then published to
the local HF cache as `hearth/demo-chat`.

Runs in one process that owns every MLX call (the `make-demo-model`
command), so it imports MLX lazily and knows nothing of Django.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from core.paths import read_json, read_text
from inference.demo import corpus
from inference.demo.files import (
    CHAT_TEMPLATE,
    IM_END,
    PAD,
    llama_config,
    publish_to_cache,
    train_tokenizer,
    write_model_dir,
)

log = logging.getLogger("hearth.demo")

DEMO_REPO = "hearth/demo-chat"
DEMO_PREFIX = "hearth/demo-"  # every model `make-demo-model` publishes


def is_demo(model_id: str) -> bool:
    """One of the small models Hearth trains on this machine to show its plumbing."""
    return model_id.startswith(DEMO_PREFIX)
BUILDER_VERSION = 3  # bump when the recipe changes so cached builds are redone
MARKER = "hearth_demo.json"


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    vocab_size: int = 768
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 688
    context: int = 512
    seq_len: int = 128  # the longest example kept; batches pad to their own longest
    batch: int = 24
    steps: int = 500
    # At 2e-3 the model learned the calls' form but never to copy the page
    # or the value from the question into the arguments (six recipes, up to
    # 1000 steps); at 6e-4 it copies them within a few hundred steps.
    lr: float = 6e-4
    warmup: int = 20
    examples: int = 16000


def cached_snapshot(cache_dir: Path, recipe: Recipe) -> Path | None:
    """The published demo snapshot, if one exists for this exact recipe."""
    repo_dir = cache_dir / ("models--" + DEMO_REPO.replace("/", "--"))
    try:
        snapshot = repo_dir / "snapshots" / read_text(repo_dir / "refs" / "main", "ref", 4096).strip()
        marker = read_json(snapshot / MARKER, "demo marker")
    except (OSError, ValueError):  # missing, unreadable, or not a regular file
        return None
    wanted = {"builder_version": BUILDER_VERSION, "recipe": asdict(recipe)}
    return snapshot if marker == wanted and (snapshot / "model.safetensors").exists() else None


@functools.lru_cache(maxsize=1)
def _template():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    return env.from_string(CHAT_TEMPLATE)


def render(messages: list[dict], kwargs: dict) -> str:
    """The chat template rendered as transformers renders it (trim_blocks,
    lstrip_blocks, a non-escaping tojson), ending with the generation prompt."""
    return _template().render(messages=messages, add_generation_prompt=True, **kwargs)


def _examples(data) -> list[tuple[str, str]]:
    return [(render(messages, kwargs), target + IM_END) for messages, target, kwargs in data]


def _corpus_text(data) -> list[str]:
    return [prompt + target for prompt, target in _examples(data)]


def _batches(tok, data, recipe: Recipe, pad_id: int) -> list[tuple[list[list[int]], list[list[int]]]]:
    """Examples tokenized as prompt + reply (loss on the reply and its end
    marker only), shuffled into batches padded to their longest row (rounded
    up to 16). Batches sorted by length trained faster per step but each held
    one kind of reply, and the loss swung from batch to batch (batching
    within length bands did the same: it held the dashboard turns apart)."""
    rows = []
    for prompt, target in _examples(data):
        p, t = tok.encode(prompt).ids, tok.encode(target).ids
        if len(p) + len(t) <= recipe.seq_len:
            rows.append((p + t, [0] * len(p) + [1] * len(t)))
    random.Random(recipe.seed).shuffle(rows)
    batches = []
    for start in range(0, len(rows) - recipe.batch + 1, recipe.batch):
        chunk = rows[start:start + recipe.batch]
        width = -(-max(len(ids) for ids, _ in chunk) // 16) * 16
        batches.append(([ids + [pad_id] * (width - len(ids)) for ids, _ in chunk],
                        [mask + [0] * (width - len(mask)) for _, mask in chunk]))
    return batches


def train(recipe: Recipe, out: Path, progress=None) -> dict:
    """Train the demo model into `out`; returns a summary with the final loss."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    data = corpus.samples(recipe.seed, recipe.examples)
    tok = train_tokenizer(_corpus_text(data), recipe.vocab_size, words=corpus.WHOLE_WORDS, numbers_apart=True)
    pad_id, eos_id = tok.token_to_id(PAD), tok.token_to_id(IM_END)
    batches = [(mx.array(ids, dtype=mx.int32), mx.array(masks, dtype=mx.float32))
               for ids, masks in _batches(tok, data, recipe, pad_id)]

    config = llama_config(tok.get_vocab_size(), recipe.hidden, recipe.layers, recipe.heads,
                          recipe.intermediate, recipe.context, eos_id)
    mx.random.seed(recipe.seed)
    model = Model(ModelArgs.from_dict(config))
    schedule = optim.join_schedules(
        [optim.linear_schedule(1e-5, recipe.lr, recipe.warmup),
         optim.cosine_decay(recipe.lr, recipe.steps - recipe.warmup, recipe.lr * 0.05)],
        [recipe.warmup])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)

    def loss_fn(model, x, m):
        logits = model(x[:, :-1])
        losses = nn.losses.cross_entropy(logits, x[:, 1:], reduction="none")
        weights = m[:, 1:]
        return (losses * weights).sum() / weights.sum()

    value_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    def step_fn(x, m):
        loss, grads = value_and_grad(model, x, m)
        # Batches mix very different replies; without clipping, runs that
        # differed only in data order ended anywhere between fluent and babble.
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    # Compiling the whole step saves about a fifth of the time on the CPU.
    step_fn = mx.compile(step_fn, inputs=state, outputs=state)
    order = random.Random(recipe.seed)
    started, loss_value = time.monotonic(), math.nan
    for step in range(1, recipe.steps + 1):
        ids, masks = batches[order.randrange(len(batches))]
        loss = step_fn(ids, masks)
        mx.eval(state, loss)
        loss_value = loss.item()
        if progress and (step % 25 == 0 or step == recipe.steps):
            progress(step, recipe.steps, loss_value, time.monotonic() - started)

    weights = dict(tree_flatten(model.parameters()))
    generation = {"eos_token_id": eos_id, "pad_token_id": pad_id, "temperature": 0.3, "top_k": 20}
    write_model_dir(out, weights, config, tok, generation)
    (out / MARKER).write_text(json.dumps({"builder_version": BUILDER_VERSION, "recipe": asdict(recipe)}))
    (out / "README.md").write_text(
        "# hearth/demo-chat\n\nA tiny llama chat model built and trained on this machine by "
        "`hearth make-demo-model` from a synthetic corpus of templated questions and answers.\n")
    return {"steps": recipe.steps, "final_loss": loss_value, "seconds": time.monotonic() - started,
            "batches": len(batches)}


def build(cache_dir: Path, recipe: Recipe = Recipe(), force: bool = False, progress=None) -> tuple[Path, bool]:
    """Return the demo snapshot path, training it first unless cached.
    The second value says whether a build happened."""
    if not force:
        existing = cached_snapshot(cache_dir, recipe)
        if existing is not None:
            return existing, False
    work = Path(tempfile.mkdtemp(prefix="hearth-demo-"))
    try:
        summary = train(recipe, work, progress)
        log.info("demo model trained: %s", summary)
        return publish_to_cache(work, DEMO_REPO, cache_dir), True
    finally:
        shutil.rmtree(work, ignore_errors=True)
