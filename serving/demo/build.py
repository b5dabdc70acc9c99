"""Build the embedded demo model: a small llama with its own BPE tokenizer,
trained briefly on the CPU on the synthetic chat corpus, then published to
the local HF cache as `hearth/demo-chat`.

Runs in one process that owns every MLX call (the `make-demo-model`
command), so it imports MLX lazily and knows nothing of Django.

With `checkpoints`, the model is published before its first step (the
trained tokenizer, the initial weights: it answers, in babble, seconds
after the build starts) and again at each step of `CHECKPOINTS`, so a
server can serve it at once and swap in each better one while the
training goes on. Those snapshots carry a `checkpoint` in their marker;
only the last one, the whole recipe trained, is the finished build
(`cached_snapshot`). Training is the same either way: publishing reads the
weights and changes nothing, so the finished model is the one a build
without checkpoints makes.

With a `resume_path`, the training state is saved at each step of
CHECKPOINTS (and on Ctrl-C), and a build of the same recipe and corpus
cut short before goes on from the last one saved instead of step 0; the
finished model is the same either way (`resume` says what is saved).
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from core.paths import read_json, read_text
from core.tempdirs import owned_tempdir
from hub.publish import publish_to_cache
from serving.demo import corpus, resume
from serving.demo.files import (
    CHAT_TEMPLATE,
    IM_END,
    PAD,
    llama_config,
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
# Steps after which a build with checkpoints publishes the model (the last step always does).
# Step 0 is the untrained model, out seconds after the start so that a server answers at once
# (babble, as any model of the first few dozen steps would); step 40 answers in the right form
# about a minute later on 2 cores; the later ones are spaced as the loss falls.
CHECKPOINTS = (0, 40, 100, 200, 300, 400)


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


def _marker(recipe: Recipe, checkpoint: dict | None = None) -> dict:
    marker: dict = {"builder_version": BUILDER_VERSION, "recipe": asdict(recipe)}
    if checkpoint is not None:
        marker["checkpoint"] = checkpoint
    return marker


def _published(cache_dir: Path) -> tuple[Path, dict] | None:
    """The snapshot `refs/main` names and its marker, or None."""
    repo_dir = cache_dir / ("models--" + DEMO_REPO.replace("/", "--"))
    try:
        snapshot = repo_dir / "snapshots" / read_text(repo_dir / "refs" / "main", "ref", 4096).strip()
        marker = read_json(snapshot / MARKER, "demo marker")
    except (OSError, ValueError):  # missing, unreadable, or not a regular file
        return None
    if not isinstance(marker, dict) or not (snapshot / "model.safetensors").exists():
        return None
    return snapshot, marker


def cached_snapshot(cache_dir: Path, recipe: Recipe) -> Path | None:
    """The finished demo snapshot, if one exists for this exact recipe."""
    found = _published(cache_dir)
    return found[0] if found is not None and found[1] == _marker(recipe) else None


def published_step(cache_dir: Path, recipe: Recipe) -> int | None:
    """How many steps of `recipe` the published demo model was trained for
    (`recipe.steps` when finished), or None when none of this recipe is."""
    found = _published(cache_dir)
    if found is None:
        return None
    marker = dict(found[1])
    checkpoint = marker.pop("checkpoint", None)
    if marker != _marker(recipe):
        return None
    if checkpoint is None:
        return recipe.steps
    step = checkpoint.get("step") if isinstance(checkpoint, dict) else None
    return step if isinstance(step, int) else None


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


_TRAINED: dict[Path, tuple[tuple[int, int, int], list[str] | None]] = {}  # marker -> (its stat, the answer)


def trained_tools(model_dir: Path) -> list[str] | None:
    """The tools a model folder says it was trained to call, or None when it
    says nothing (any model but a demo chat build: no limit). A demo chat
    build's marker names this builder and a chat recipe, and such a build
    learned the corpus's tools and no others: the dashboard's three app
    tools and four practice tools. Offered any other, it stops calling
    those it knows (chat/toolloop.py offers it only these). Asked on every
    chat turn: the marker is read again only when its stat changed (a
    checkpoint published over it)."""
    path = Path(model_dir) / MARKER
    try:
        st = path.stat()
    except OSError:
        return None
    seen = (st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _TRAINED.get(path)
    if cached is None or cached[0] != seen:
        if len(_TRAINED) >= 256:  # folders come and go (each checkpoint a snapshot): keep the recent ones
            _TRAINED.clear()
        cached = _TRAINED[path] = (seen, _read_trained_tools(path))
    return None if cached[1] is None else list(cached[1])


def _read_trained_tools(path: Path) -> list[str] | None:
    try:
        marker = read_json(path, "demo marker")
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("builder_version") != BUILDER_VERSION \
            or not isinstance(marker.get("recipe"), dict) or set(marker["recipe"]) != set(asdict(Recipe())):
        return None  # another builder's demo (vision, speech), or an older builder's
    return [*corpus.APP_TOOLS, *corpus.TOOLS]


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


def train(recipe: Recipe, out: Path, progress=None, checkpoint=None, resume_path: Path | None = None,
          resumed=None, finish=None) -> dict:
    """Train the demo model into `out`; returns a summary with the final loss.
    `checkpoint(step, loss, write)`, when given, is called after each step
    of CHECKPOINTS before the last (step 0: before the first, the loss
    None); `write(folder, marker)` writes the model as it is then.

    With `resume_path`, the training state is saved there at each of those
    steps, and on Ctrl-C or SIGTERM once the step under way is done
    (`resume.StopAsked`: then KeyboardInterrupt; `progress` is told of every step); a
    state saved by an earlier build of this recipe and corpus is gone on
    from (`resumed(step, loss)` is told, then `checkpoint` at that step),
    and the remaining steps are those an uninterrupted build takes
    (serving/demo/resume.py says what is saved, and why that is enough).
    `finish(out)`, when given, is called once the model is written (the
    build publishes it there); a stop asked from the last step on waits for
    both, so the finished model is never cut off half-published."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    data = corpus.samples(recipe.seed, recipe.examples)
    tok = train_tokenizer(_corpus_text(data), recipe.vocab_size, words=corpus.WHOLE_WORDS, numbers_apart=True)
    pad_id, eos_id = tok.token_to_id(PAD), tok.token_to_id(IM_END)
    assert pad_id is not None and eos_id is not None  # special tokens train_tokenizer always adds
    raw = _batches(tok, data, recipe, pad_id)
    batches = [(mx.array(ids, dtype=mx.int32), mx.array(masks, dtype=mx.float32)) for ids, masks in raw]

    config = llama_config(tok.get_vocab_size(), recipe.hidden, recipe.layers, recipe.heads,
                          recipe.intermediate, recipe.context, eos_id)
    model, optimizer = _model_and_optimizer(recipe, config)
    ident: dict = {}
    saved = None
    if resume_path is not None:  # before the step is compiled: it holds the state it updates
        ident = resume.identity(BUILDER_VERSION, asdict(recipe),
                                [tok.to_str(), json.dumps(raw, separators=(",", ":"))])
        saved = resume.restore(resume_path, ident, model.parameters(), optimizer)
        if saved is not None:
            model.load_weights(list(saved.weights.items()))
    step_fn, state = _compiled_step(model, optimizer)
    generation = {"eos_token_id": eos_id, "pad_token_id": pad_id, "temperature": 0.3, "top_k": 20}

    def write(folder: Path, marker: dict) -> None:
        write_model_dir(folder, dict(tree_flatten(model.parameters())), config, tok, generation)
        (folder / MARKER).write_text(json.dumps(marker))
        (folder / "README.md").write_text(
            "# hearth/demo-chat\n\nA tiny llama chat model built and trained on this machine by "
            "`hearth make-demo-model` from a synthetic corpus of templated questions and answers.\n")

    order = random.Random(recipe.seed)
    started, loss_value, first = time.monotonic(), math.nan, 1
    if saved is not None:
        first, loss_value = saved.step + 1, math.nan if saved.loss is None else saved.loss
        for _ in range(saved.step):  # the data order up to there, drawn again (resume.py)
            order.randrange(len(batches))
        if resumed:  # the caller says so (a terminal, or the server's log from the build's state)
            resumed(saved.step, saved.loss)
        else:
            log.info("demo build: resuming from step %d of %d", saved.step, recipe.steps)
        if checkpoint:
            checkpoint(saved.step, saved.loss, write)
    elif checkpoint and 0 in CHECKPOINTS:
        checkpoint(0, None, write)
    with resume.StopAsked(resume_path is not None) as stop:
        for step in range(first, recipe.steps + 1):
            ids, masks = batches[order.randrange(len(batches))]
            loss = step_fn(ids, masks)
            mx.eval(state, loss)
            loss_value = loss.item()
            if progress:  # every step: on a busy machine a step can take seconds, and /health shows where it stands
                progress(step, recipe.steps, loss_value, time.monotonic() - started)
            if resume_path is not None and step < recipe.steps and (step in CHECKPOINTS or stop.asked):
                resume.save_or_warn(resume_path, ident, step, loss_value, model.parameters(), optimizer)
            if stop.stop_here(step, recipe.steps):
                raise KeyboardInterrupt
            if checkpoint and step in CHECKPOINTS and step < recipe.steps:
                checkpoint(step, loss_value, write)
        write(out, _marker(recipe))
        if finish:
            finish(out)
    return {"steps": recipe.steps, "final_loss": loss_value, "seconds": time.monotonic() - started,
            "batches": len(batches), "resumed_from": None if saved is None else saved.step}


def _model_and_optimizer(recipe: Recipe, config: dict):
    """The untrained model, from the recipe's seed, and its optimizer, not stepped yet."""
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx_lm.models.llama import Model, ModelArgs

    mx.random.seed(recipe.seed)
    model = Model(ModelArgs.from_dict(config))
    schedule = optim.join_schedules(
        [optim.linear_schedule(1e-5, recipe.lr, recipe.warmup),
         optim.cosine_decay(recipe.lr, recipe.steps - recipe.warmup, recipe.lr * 0.05)],
        [recipe.warmup])
    return model, optim.AdamW(learning_rate=schedule, weight_decay=0.01)


def _compiled_step(model, optimizer):
    """One training step, compiled, and the state it updates: `step_fn(ids, masks)` returns the loss."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

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
    return mx.compile(step_fn, inputs=state, outputs=state), state


def build(cache_dir: Path, recipe: Recipe = Recipe(), force: bool = False, progress=None,
          published=None, resume_path: Path | None = None, resumed=None) -> tuple[Path, bool]:
    """Return the demo snapshot path, training it first unless cached.
    The second value says whether a build happened. With `published`, the
    model is also published at each checkpoint that is further along than
    what the cache holds (a build cut short before keeps serving until this
    one passes it), and `published(step, loss, snapshot)` is told of each.
    With `resume_path`, a build cut short leaves its training state there
    and the next one goes on from it (`train`; `resumed(step, loss)` is
    told); the state is removed once a build finishes, and `force` starts over."""
    if not force:
        existing = cached_snapshot(cache_dir, recipe)
        if existing is not None:
            resume.finished(resume_path, lambda: _prune_checkpoints(existing))  # a build killed as it ended
            return existing, False
    elif resume_path is not None:
        resume.clear(resume_path)

    def checkpoint(step: int, loss: float | None, write) -> None:
        served = published_step(cache_dir, recipe)
        if served is not None and served >= step and not force:
            return
        folder = work / f"step-{step}"
        write(folder, _marker(recipe, {"step": step, "steps": recipe.steps,
                                       "loss": None if loss is None else round(loss, 4)}))
        snapshot = publish_to_cache(folder, DEMO_REPO, cache_dir)
        shutil.rmtree(folder, ignore_errors=True)
        _prune_checkpoints(snapshot)
        published(step, loss, snapshot)

    done: list[Path] = []

    def finish(folder: Path) -> None:
        snapshot = publish_to_cache(folder, DEMO_REPO, cache_dir)
        resume.finished(resume_path, lambda: _prune_checkpoints(snapshot))
        done.append(snapshot)

    with owned_tempdir("hearth-demo-chat-") as work:
        summary = train(recipe, work / "final", progress, checkpoint if published else None, resume_path, resumed,
                        finish)
        log.info("demo model trained: %s", summary)
        return done[0], True


def _prune_checkpoints(current: Path) -> None:
    """Remove the demo's earlier checkpoint snapshots, and the blobs only
    they used: a served process holds its weights in memory, and a finished
    build leaves one snapshot, as a build without checkpoints does."""
    snapshots = current.parent
    for other in snapshots.iterdir():
        if other == current or not other.is_dir():
            continue
        try:
            marker = read_json(other / MARKER, "demo marker")
        except (OSError, ValueError):
            continue
        if isinstance(marker, dict) and "checkpoint" in marker:
            shutil.rmtree(other, ignore_errors=True)
    used = {(link.parent / os.readlink(link)).resolve() for snap in snapshots.iterdir() if snap.is_dir()
            for link in snap.iterdir() if link.is_symlink()}
    for blob in (snapshots.parent / "blobs").iterdir():
        if blob.resolve() not in used and not blob.name.endswith(".incomplete"):
            blob.unlink(missing_ok=True)
