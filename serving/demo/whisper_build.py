"""Build the demo speech model: a tiny Whisper (mlx_whisper's own classes,
small `ModelDimensions`, the multilingual tokenizer mlx_whisper ships)
trained on the CPU to transcribe digit strings spoken by espeak-ng, then
published to the local HF cache as `hearth/demo-whisper`.

How it stays cheap enough for a few minutes of CPU:
- the encoder has no attention blocks (two convolutions and the
  positional embedding); attention over 1500 positions is what costs, and
  without it a clip padded to 30 s trains exactly as it is transcribed;
- the decoder learns only the tokens it needs (task markers, timestamps,
  the digits): the output layer trains over that subset plus one column
  that stands for every other token (their embeddings stay zero, so their
  logits are 0 and that column carries log(count) to match). The full
  embedding is written out at the end, so mlx_whisper loads it as usual.

Runs in the one process that owns every MLX call (`make-demo-model`);
imports MLX lazily and knows nothing of Django.
"""
from __future__ import annotations

import json
import logging
import math
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from core.paths import read_json, read_text
from hub.publish import publish_to_cache
from serving.demo import speech_data

log = logging.getLogger("hearth.demo")

WHISPER_REPO = "hearth/demo-whisper"
BUILDER_VERSION = 3
MARKER = "hearth_demo.json"
N_VOCAB = 51865  # the multilingual tokenizer's size (99 languages)
SEQ = 32  # training rows pad to this many tokens
CROP = 512  # mel frames of each clip computed in training (5.12 s; clips are shorter)


@dataclass(frozen=True)
class WhisperRecipe:
    seed: int = 0
    width: int = 96
    heads: int = 4
    decoder_layers: int = 3
    voices: int = 60  # speakers (voice, speed, pitch), each saying every digit once
    steps: int = 400
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 20
    prompted: float = 0.2  # share of rows that carry a previous-text prompt (<|startofprev|>)


TEXT_CTX = 448  # Whisper's decoder context; decoding stops at half of it


def dimensions(recipe: WhisperRecipe, text_ctx: int = TEXT_CTX) -> dict:
    return {"n_mels": 80, "n_audio_ctx": 1500, "n_audio_state": recipe.width, "n_audio_head": recipe.heads,
            "n_audio_layer": 0, "n_vocab": N_VOCAB, "n_text_ctx": text_ctx, "n_text_state": recipe.width,
            "n_text_head": recipe.heads, "n_text_layer": recipe.decoder_layers}


def cached_snapshot(cache_dir: Path, recipe: WhisperRecipe) -> Path | None:
    repo_dir = cache_dir / ("models--" + WHISPER_REPO.replace("/", "--"))
    try:
        snapshot = repo_dir / "snapshots" / read_text(repo_dir / "refs" / "main", "ref", 4096).strip()
        marker = read_json(snapshot / MARKER, "demo marker")
    except (OSError, ValueError):
        return None
    wanted = {"builder_version": BUILDER_VERSION, "recipe": asdict(recipe)}
    ok = isinstance(marker, dict) and {k: marker.get(k) for k in wanted} == wanted
    return snapshot if ok and (snapshot / "weights.safetensors").exists() else None


class Vocab:
    """The tokens the demo model learns, and the map from the tokenizer's ids to theirs."""

    def __init__(self):
        from mlx_whisper.tokenizer import get_tokenizer

        tok = self.tokenizer = get_tokenizer(True, num_languages=N_VOCAB - 51766, language="en")
        self.digit = {d: tok.encode(f" {d}") for d in "0123456789"}
        assert all(len(ids) == 1 for ids in self.digit.values()), "digits must be single tokens"
        self.en = tok.sot_sequence[1]
        ids = [tok.sot, tok.eot, tok.sot_prev, tok.no_timestamps, tok.transcribe, tok.translate, tok.no_speech,
               self.en, *(ids[0] for ids in self.digit.values()),
               *range(tok.timestamp_begin, tok.timestamp_begin + 1501)]
        self.ids = sorted(set(ids))
        self.index = np.zeros(N_VOCAB, np.int32)
        self.index[self.ids] = np.arange(len(self.ids))
        self.others = N_VOCAB - len(self.ids)

    def ts(self, seconds: float) -> int:
        return self.tokenizer.timestamp_begin + max(0, min(1500, round(seconds / 0.02)))

    def row(self, digits: str, spans: list[tuple[float, float]], task: int,
            prompt: str | None) -> tuple[list[int], list[int]]:
        """Token ids (the tokenizer's) and which of them are trained targets:
        each digit its own timestamped segment, so the decoder learns where
        to listen (<|start|> digit <|end|>)."""
        tok = self.tokenizer
        head: list[int] = []
        if prompt:
            head = [tok.sot_prev, *(self.digit[d][0] for d in prompt.split())]
        body = [tok.sot, self.en, task]
        for d, (start, end) in zip(digits.split(), spans, strict=True):
            body += [self.ts(start), self.digit[d][0], self.ts(end)]
        body.append(tok.eot)
        # Targets: what follows <|startoftranscript|> except the task (the caller picks it).
        mask = [0] * len(head) + [0, 1, 0] + [1] * (len(body) - 3)
        return head + body, mask


def _mel(audio: np.ndarray):
    """The first CROP log-mel frames mlx_whisper's `transcribe` gives this
    clip padded to 30 s: the clip's own frames, then silence at the clamp
    floor (every frame after them is that floor too)."""
    import mlx.core as mx
    from mlx_whisper.audio import log_mel_spectrogram

    mel = log_mel_spectrogram(audio[:CROP * 160 - 1600], padding=16000)[:CROP]
    pad = mx.broadcast_to(mel.min(), (CROP - mel.shape[0], mel.shape[1]))
    return mx.concatenate([mel, pad], axis=0)


def encode(encoder, crop):
    """`encoder` (no attention blocks) on the full 30 s window of which
    `crop` holds the first CROP frames, the rest being the floor of its last
    frame. The convolutions are local, so every position past the crop has
    the same features before the positional embedding: computed once from a
    patch of floor frames, not 1500 times."""
    import mlx.core as mx
    import mlx.nn as nn

    x = nn.gelu(encoder.conv2(nn.gelu(encoder.conv1(crop))))
    keep = CROP // 2 - 2  # the crop's last positions see its zero padding; the floor patch stands for them
    patch = mx.repeat(crop[:, -1:, :], 8, axis=1)
    floor = nn.gelu(encoder.conv2(nn.gelu(encoder.conv1(patch))))[:, 2:3]
    rest = mx.broadcast_to(floor, (crop.shape[0], 1500 - keep, floor.shape[-1]))
    x = mx.concatenate([x[:, :keep], rest], axis=1) + encoder._positional_embedding
    return encoder.ln_post(x)


def _batch(voices, vocab: Vocab, recipe: WhisperRecipe, rng: random.Random, noise: np.random.Generator):
    import mlx.core as mx

    mels, rows, masks = [], [], []
    tok = vocab.tokenizer
    for _ in range(recipe.batch):
        digits = speech_data.random_digits(rng, 1, 5)
        audio, spans = speech_data.compose(voices[rng.randrange(len(voices))], digits, noise)
        prompt = speech_data.random_digits(rng, 1, 5) if rng.random() < recipe.prompted else None
        task = tok.translate if rng.random() < 0.3 else tok.transcribe
        ids, mask = vocab.row(digits, spans, task, prompt)
        mels.append(_mel(audio))
        rows.append([int(i) for i in vocab.index[ids]] + [0] * (SEQ - len(ids)))
        masks.append(mask + [0] * (SEQ - len(mask)))
    return mx.stack(mels), mx.array(rows, dtype=mx.int32), mx.array(masks, dtype=mx.float32)


def _model(recipe: WhisperRecipe, vocab: Vocab, text_ctx: int = TEXT_CTX):
    """mlx_whisper's Whisper with a decoder embedding over the learned tokens only."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_whisper.whisper import ModelDimensions, Whisper, sinusoids

    mx.random.seed(recipe.seed)
    model = Whisper(ModelDimensions(**dimensions(recipe, text_ctx)), mx.float32)
    model.decoder.token_embedding = nn.Embedding(len(vocab.ids), recipe.width)
    # Timestamp k starts as the encoder's positional embedding of position k:
    # a query made from it finds that place in the audio from the first step.
    first = vocab.tokenizer.timestamp_begin
    rows = mx.array(vocab.index[first:first + 1501])
    table = sinusoids(1501, recipe.width) * math.sqrt(2 / recipe.width)
    weight = model.decoder.token_embedding.weight
    model.decoder.token_embedding.weight = weight.at[rows].add(table - weight[rows])
    # The first block's cross-attention starts as that lookup: its queries and
    # keys compare positional embeddings (sharpened), so a timestamp token
    # attends to its place in the audio before anything is learned
    # (`start_lookups` makes it hold in training: see there).
    cross = model.decoder.blocks[0].cross_attn
    cross.query.weight = mx.eye(recipe.width) * 4.0
    cross.key.weight = mx.eye(recipe.width)
    # The text positions are learned; Whisper starts them near zero.
    model.decoder.positional_embedding = mx.random.normal((448, recipe.width)) * 0.01
    return model


LOOKUP_OFFSETS = ((0, 4, 8, 12), (2, 6, 10, 14), (0, 8, 16, -4))  # encoder positions (20 ms) after the timestamp


def _turn(width: int, delta: int) -> np.ndarray:
    """The matrix that moves Whisper's sinusoid of position t (sin block,
    then cos block) to that of t + delta: a rotation of each sin/cos pair."""
    half = width // 2
    rate = np.exp(-math.log(10000) / (half - 1) * np.arange(half))
    c, s, i = np.cos(delta * rate), np.sin(delta * rate), np.arange(half)
    turn = np.zeros((width, width), np.float32)
    turn[i, i], turn[i, half + i], turn[half + i, half + i], turn[half + i, i] = c, s, c, -s
    return turn


def start_lookups(model, recipe: WhisperRecipe) -> None:
    """Training's start: each decoder block's cross-attention heads look a
    fixed distance after (or, one head, before) the place a timestamp's
    embedding names (LOOKUP_OFFSETS, in 20 ms positions); the output weights
    of every residual branch (self-attention, cross-attention, MLP) start at
    zero (their biases stay as initialised, small),
    so each block's queries see the token embeddings untouched. Without the
    zeros the first block's self-attention scrambled its query and the
    lookup `_model` sets never held (measured: peaks hundreds of positions
    off); with them the frames that tell a word's digit reach the output
    through a path that starts linear. Each head's key takes every
    `heads`-th frequency of the sinusoids (sin and cos together); its query
    turns the timestamp's sinusoid forward by the head's offset."""
    import mlx.core as mx

    width, heads = recipe.width, recipe.heads
    half, size = width // 2, width // recipe.heads
    order = np.concatenate([np.r_[np.arange(h, half, heads), half + np.arange(h, half, heads)] for h in range(heads)])
    eye = np.eye(width, dtype=np.float32)
    for block, offsets in zip(model.decoder.blocks, LOOKUP_OFFSETS, strict=False):
        query, key = np.zeros((width, width), np.float32), np.zeros((width, width), np.float32)
        for h, delta in enumerate(offsets[:heads]):
            rows = order[h * size:(h + 1) * size]
            key[h * size:(h + 1) * size], query[h * size:(h + 1) * size] = eye[rows], _turn(width, delta)[rows] * 4.0
        block.cross_attn.query.weight, block.cross_attn.key.weight = mx.array(query), mx.array(key)
    for block in model.decoder.blocks:
        block.attn.out.weight = mx.zeros_like(block.attn.out.weight)
        block.cross_attn.out.weight = mx.zeros_like(block.cross_attn.out.weight)
        block.mlp2.weight = mx.zeros_like(block.mlp2.weight)
    # The audio's features start a third as strong as the positional embedding they join (a tenth otherwise).
    model.encoder.conv2.weight = model.encoder.conv2.weight * 3.0
    model.encoder.conv2.bias = model.encoder.conv2.bias * 3.0


def train(recipe: WhisperRecipe, out: Path, progress=None) -> dict:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    started = time.monotonic()
    vocab = Vocab()
    voices = speech_data.voices(recipe.voices, recipe.seed)
    synth_s = time.monotonic() - started
    model = _model(recipe, vocab)
    start_lookups(model, recipe)
    others = math.log(vocab.others)

    def loss_fn(model, mel, ids, mask):
        logits = model.decoder(ids[:, :-1], encode(model.encoder, mel))[0]
        rest = mx.full((*logits.shape[:2], 1), others, dtype=logits.dtype)
        losses = nn.losses.cross_entropy(mx.concatenate([logits, rest], axis=-1), ids[:, 1:], reduction="none")
        weights = mask[:, 1:]
        return (losses * weights).sum() / weights.sum()

    schedule = optim.join_schedules(
        [optim.linear_schedule(1e-5, recipe.lr, recipe.warmup),
         optim.cosine_decay(recipe.lr, recipe.steps - recipe.warmup, recipe.lr * 0.05)], [recipe.warmup])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    value_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    def step_fn(mel, ids, mask):
        loss, grads = value_and_grad(model, mel, ids, mask)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    step_fn = mx.compile(step_fn, inputs=state, outputs=state)
    rng, noise = random.Random(recipe.seed), np.random.default_rng(recipe.seed)
    loss_value, trained = math.nan, time.monotonic()
    for step in range(1, recipe.steps + 1):
        loss = step_fn(*_batch(voices, vocab, recipe, rng, noise))
        mx.eval(state, loss)
        loss_value = loss.item()
        if progress and (step % 25 == 0 or step == recipe.steps):
            progress(step, recipe.steps, loss_value, time.monotonic() - started)
    _write(model, vocab, recipe, out)
    return {"steps": recipe.steps, "final_loss": loss_value, "synth_seconds": round(synth_s, 1),
            "train_seconds": round(time.monotonic() - trained, 1), "voices": len(voices)}


def _write(model, vocab: Vocab, recipe: WhisperRecipe, out: Path, text_ctx: int = TEXT_CTX) -> None:
    """The model as mlx_whisper loads it: config.json and weights.safetensors,
    the embedding widened back to the full vocabulary (zero rows elsewhere)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    weights = dict(tree_flatten(model.parameters()))
    full = np.zeros((N_VOCAB, recipe.width), np.float32)
    full[vocab.ids] = np.array(weights["decoder.token_embedding.weight"])
    weights["decoder.token_embedding.weight"] = mx.array(full)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "weights.safetensors"), weights)
    (out / "config.json").write_text(json.dumps({"model_type": "whisper", **dimensions(recipe, text_ctx)}, indent=1))
    (out / MARKER).write_text(json.dumps({"builder_version": BUILDER_VERSION, "recipe": asdict(recipe)}))
    (out / "README.md").write_text(
        f"# {WHISPER_REPO}\n\nA tiny Whisper built and trained on this machine by `hearth make-demo-model "
        "--kind audio` on digit strings spoken by espeak-ng. It transcribes spoken digits (\"four seven one\" "
        "-> \"4 7 1\") and nothing else.\n")


def evaluate(path: Path, n: int = 40, seed: int = 12345) -> dict:
    """Exact-match accuracy of the built model on fresh takes (another seed):
    `sentences`, espeak-ng reading the whole string at once (how the tests
    and a person speak), and `words`, digits said one by one with pauses
    (how it trained)."""
    from inference.engine import speech

    model = speech.load(str(path))
    noise = np.random.default_rng(seed)
    rng = random.Random(seed)
    voices = speech_data.voices(8, seed)
    takes = [(c.digits, speech_data.augment(c.audio, noise)) for c in speech_data.synthesize(n, seed)]
    for _ in range(n):
        digits = speech_data.random_digits(rng, 1, 5)
        takes.append((digits, speech_data.compose(voices[rng.randrange(len(voices))], digits, noise)[0]))
    right = {"sentences": 0, "words": 0}
    started, audio_s = time.monotonic(), 0.0
    for i, (digits, audio) in enumerate(takes):
        audio_s += len(audio) / speech_data.RATE
        text = speech.transcribe_window(model, audio, speech.Options(temperature=0.0))["text"]
        right["sentences" if i < n else "words"] += " ".join(ch for ch in text if ch.isdigit()) == digits
    seconds = time.monotonic() - started
    return {"takes": 2 * n, **{k: round(v / n, 3) for k, v in right.items()}, "seconds": round(seconds, 1),
            "real_time_factor": round(seconds / audio_s, 3)}


def build(cache_dir: Path, recipe: WhisperRecipe = WhisperRecipe(), force: bool = False,
          progress=None) -> tuple[Path, bool, dict]:
    """The demo Whisper's snapshot, trained first unless cached; whether a
    build happened; the training summary (empty when cached)."""
    if not force:
        existing = cached_snapshot(cache_dir, recipe)
        if existing is not None:
            return existing, False, {}
    work = Path(tempfile.mkdtemp(prefix="hearth-demo-whisper-"))
    try:
        summary = train(recipe, work, progress)
        summary["eval"] = evaluate(work)
        log.info("demo whisper trained: %s", summary)
        marker = {"builder_version": BUILDER_VERSION, "recipe": asdict(recipe), "summary": summary}
        (work / MARKER).write_text(json.dumps(marker))
        return publish_to_cache(work, WHISPER_REPO, cache_dir), True, summary
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_random(out: Path, seed: int = 0, text_ctx: int = 64) -> Path:
    """An untrained Whisper of the demo's shape (tests of the plumbing).

    Its decoder context is short by default: an untrained model never ends a
    window by itself, so it decodes to Whisper's limit (half the context) and,
    its noise failing the quality checks, again at every fallback temperature.
    With 448 positions one chat audio part took ~18 s on a 2-core CPU; with 64,
    under a second, through the same code paths."""
    recipe = WhisperRecipe(seed=seed, width=64, heads=2, decoder_layers=1)
    _write(_model(recipe, Vocab(), text_ctx), Vocab(), recipe, out, text_ctx)
    return out
