"""Build the demo speech model: a Whisper (mlx_whisper's own classes, the
multilingual tokenizer mlx_whisper ships) that transcribes digit strings,
published to the local HF cache as `hearth/demo-whisper`.

Only a small part of it is trained: the tagger, which reads log-mel
frames and says at each 20 ms encoder position whether a word starts there
and which digit it is. It trains on this CPU in minutes, on digits that
espeak-ng speaks, each word's start known: 60 voices saying each digit
alone, composed with pauses; 600 strings read with pauses, cut into their
words and run together again; and 600 read fluently, where libespeak-ng
says each word starts). Everything else, the encoder's feature copies
and the whole decoder, is written by hand (`whisper_wiring`): the search
for the next word, the lookup of its digit, the timestamps and the end,
as weights Whisper's own decoding runs.

Why not train it all: a Whisper trained end to end on this budget learnt
to place segments but not to read them (builder 3: 0 of 80 held-out takes
exact, a training step a second for the decoder's cross-attention over
1500 positions); the tagger trains on a 256-position crop, with exact
shifts where the model has its sharp copy heads, at 32 clips a step.

With a `resume_path`, the training state (the tagger's weights, AdamW's
state and step, and the states of the generators the clips are drawn
from) is saved every `SAVE_EVERY` steps, at the last step, and when a stop
is asked (Ctrl-C, SIGTERM: the step under way finishes first); a build of
the same recipe and speech cut short before goes on from there, and the
finished model is the one an uninterrupted build makes (`resume` says
what is saved). A stop asked from the last step on lets the build write,
publish and tidy its model (`resume.StopAsked`): it ends finished; only the
held-out measuring (minutes, and a build for a server skips it) is cut
short at once, and the next build trains no step again.

Runs in the one process that owns every MLX call (`make-demo-model`);
imports MLX lazily and knows nothing of Django.
"""
from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from core.paths import read_json, read_text
from core.tempdirs import owned_tempdir
from hub.publish import publish_to_cache
from serving.demo import resume, speech_data
from serving.demo import whisper_wiring as wiring

log = logging.getLogger("hearth.demo")

WHISPER_REPO = "hearth/demo-whisper"
BUILDER_VERSION = 5
MARKER = "hearth_demo.json"
N_VOCAB = 51865  # the multilingual tokenizer's size (99 languages)
CROP = 512  # mel frames of each clip the tagger trains on (5.12 s; clips are shorter)
# Steps between two saves of the training state (with a `resume_path`). A save of the full recipe's
# (1.0 MB: the tagger's 82,027 weights, AdamW's two moments, the generators' states) took 14 ms (21 at
# most) on a busy 2-core machine, where a step takes a second or more: saving every 10 steps costs about
# 0.15% of the training, and a kill loses 10 steps at most.
SAVE_EVERY = 10


@dataclass(frozen=True)
class WhisperRecipe:
    seed: int = 0
    voices: int = 60  # speakers (voice, speed, pitch), each saying every digit alone
    sentences: int = 600  # digit strings read with pauses, cut into their words and run together
    readings: int = 600  # digit strings read fluently, where each word starts from libespeak-ng
    steps: int = 400
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 30
    fluent: float = 0.5  # share of training clips that are sentences or readings (half each)


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
    """The tokenizer and the tokens the demo model speaks."""

    def __init__(self):
        from mlx_whisper.tokenizer import get_tokenizer

        tok = self.tokenizer = get_tokenizer(True, num_languages=N_VOCAB - 51766, language="en")
        ids = {d: tok.encode(f" {d}") for d in "0123456789"}
        assert all(len(i) == 1 for i in ids.values()), "digits must be single tokens"
        self.digit = {d: i[0] for d, i in ids.items()}
        self.en = tok.sot_sequence[1]


def _mel(audio: np.ndarray):
    """The first CROP log-mel frames of the window mlx_whisper's `transcribe`
    gives the model for this clip: the clip's own frames (one per 160
    samples), then zeros. (`transcribe` pads the *log-mel* window with zeros,
    `pad_or_trim`, which is louder than the silence floor: the end of the
    audio is a step up the model must learn to ignore. Builder 4 trained on
    the floor instead and often heard a word there, a "6" mostly.)"""
    import mlx.core as mx
    from mlx_whisper.audio import log_mel_spectrogram

    frames = min(len(audio) // 160, CROP)
    mel = log_mel_spectrogram(audio[:CROP * 160], padding=16000)[:frames]
    return mx.concatenate([mel, mx.zeros((CROP - frames, mel.shape[1]), mel.dtype)], axis=0)


def _shifted(a, delta: int):
    """a[:, t + delta] at t, zeros past either end. (The copy heads read the
    nearest positions there instead; a build that repeated the end rows in
    training, which matches that, measured worse on the 80 held-out takes:
    50% and 20% exact, against 57.5% and 35% with zeros.)"""
    import mlx.core as mx

    pad = mx.zeros((a.shape[0], abs(delta), a.shape[2]), a.dtype)
    return mx.concatenate([a[:, delta:], pad], 1) if delta > 0 else mx.concatenate([pad, a[:, :delta]], 1)


def _norm(x):
    """The encoder's LayerNorms as wired: (x - mean) at the anchor's scale."""
    import mlx.core as mx

    mean = x.mean(-1, keepdims=True)
    return (x - mean) * (wiring.SIGMA / mx.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5))


class Tagger:
    """The encoder up to the tagger's output, as the wired model computes it
    on a crop (plain shifts where the model's copy heads attend), over the
    channels in use only: what training runs. `weights` are the trained
    arrays `whisper_wiring.wire_encoder` takes."""

    def __init__(self, seed: int):
        import mlx.core as mx
        from mlx_whisper.whisper import sinusoids

        mx.random.seed(seed)
        n_in = len(wiring.TAGGER_IN)

        def uniform(shape, fan):
            return mx.random.uniform(-1, 1, shape) / math.sqrt(fan)

        self.weights = {
            "c1w": uniform((wiring.CONV1, 3, 80), 240), "c1b": mx.zeros((wiring.CONV1,)),
            "c2w": uniform((wiring.FEATURES, 3, wiring.CONV1), 3 * wiring.CONV1), "c2b": mx.zeros((wiring.FEATURES,)),
            "m1w": uniform((wiring.HIDDEN, n_in), n_in), "m1b": mx.zeros((wiring.HIDDEN,)),
            "m2w": mx.zeros((11, wiring.HIDDEN)), "m2b": mx.zeros((11,))}
        anchor = np.zeros(wiring.WIDTH, np.float32)
        anchor[wiring.ANCHOR] = wiring.A
        self.base = sinusoids(1500, wiring.WIDTH) + mx.array(anchor)  # the residual before the content
        self.place = {name: self._scatter(groups) for name, groups in
                      (("content", [wiring.CONTENT]), ("first", wiring.COPIES[:3]), ("second", wiring.COPIES[3:]))}

    @staticmethod
    def _scatter(groups):
        import mlx.core as mx

        m = np.zeros((sum(len(g) for g in groups), wiring.WIDTH), np.float32)
        m[np.arange(len(m)), [c for g in groups for c in g]] = 1
        return mx.array(m)

    def __call__(self, w: dict, mel):
        """(batch, positions, 11): the onset logit, then the ten digit logits."""
        import mlx.core as mx
        import mlx.nn as nn

        h = nn.gelu(mx.conv1d(mel, w["c1w"], padding=1) + w["c1b"])
        content = nn.gelu(mx.conv1d(h, w["c2w"], stride=2, padding=1) + w["c2b"])
        x = self.base[:content.shape[1]] + content @ self.place["content"]
        for shifts, place in ((wiring.SHIFTS[0], "first"), (wiring.SHIFTS[1], "second")):
            n = _norm(x)
            read = n[..., wiring.CONTENT] - n[..., wiring.ZC:wiring.ZC + 1]
            x = x + mx.concatenate([_shifted(read, d) for d in shifts], -1) @ self.place[place]
        n = _norm(x)
        inputs = n[..., wiring.TAGGER_IN] - n[..., wiring.ZC:wiring.ZC + 1]
        return nn.gelu(inputs @ w["m1w"].T + w["m1b"]) @ w["m2w"].T + w["m2b"]


def _clip(recipe: WhisperRecipe, voices, sentences, readings, rng: random.Random, noise: np.random.Generator):
    """One training clip and where its words start (seconds): digits said
    alone with pauses, a sentence's words run together, or a fluent reading."""
    if (sentences or readings) and rng.random() < recipe.fluent:
        pick = rng.randrange(len(sentences) + len(readings))
        if pick < len(sentences):
            digits, words = sentences[pick]
            audio, spans = speech_data.run_together(words, rng, noise)
            return digits, audio, [start for start, _end in spans]
        reading = readings[pick - len(sentences)]
        audio, lead = speech_data.placed(reading.audio, noise)
        return reading.digits, audio, [lead + start for start in reading.starts]
    digits = speech_data.random_digits(rng, 1, 5)
    audio, spans = speech_data.compose(voices[rng.randrange(len(voices))], digits, noise)
    return digits, audio, [start for start, _end in spans]


def _batch(recipe: WhisperRecipe, voices, sentences, readings, rng: random.Random, noise: np.random.Generator):
    """Mel crops and per-position targets: a word starts within one position
    of its onset; its digit is named from 2 positions before to 3 after."""
    import mlx.core as mx

    mels, onsets, digits_at = [], [], []
    for _ in range(recipe.batch):
        digits, audio, starts = _clip(recipe, voices, sentences, readings, rng, noise)
        onset, digit = np.zeros(CROP // 2, np.float32), np.full(CROP // 2, -1, np.int32)
        for d, start in zip(digits.split(), starts, strict=True):
            p = round(start / 0.02)
            onset[max(0, p - 1):p + 2] = 1
            digit[max(0, p - 2):p + 4] = int(d)
        mels.append(_mel(audio))
        onsets.append(onset)
        digits_at.append(digit)
    return mx.stack(mels), mx.array(np.stack(onsets)), mx.array(np.stack(digits_at))


def _speech(voices, sentences, readings):
    """What the tagger trains on, as bytes for `resume.identity`: a state
    saved on other speech (another espeak-ng) is not gone on from.
    (libespeak-ng's fluent readings depend on what its process read before;
    each build process reads the same from its start, so a build and the one
    that goes on from it agree.)"""
    for voice in voices:
        yield from (word.tobytes() for word in voice.words)
    for digits, words in sentences:
        yield digits
        yield from (word.tobytes() for word in words)
    for reading in readings:
        yield from (reading.digits, reading.audio.tobytes(), json.dumps(reading.starts))


def train(recipe: WhisperRecipe, out: Path, progress=None, resume_path: Path | None = None, resumed=None,
          finish=None) -> dict:
    """Train the tagger, wire the rest, write the model to `out`. With
    `resume_path`, the training state is saved there as it goes, and a
    state an earlier build of this recipe saved is gone on from
    (`resumed(step, loss)` is told; the module's docstring says when).
    `finish(out, summary, stop)`, when given, is called once the model is
    written (the build measures and publishes it there); a stop asked from
    the last step on waits for both, but for what `stop.at_once()` holds."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    started = time.monotonic()
    voices = speech_data.voices(recipe.voices, recipe.seed)
    sentences = speech_data.sentences(recipe.sentences, recipe.seed) if recipe.fluent else []
    readings = speech_data.readings(recipe.readings, recipe.seed + 1) if recipe.fluent else []
    synth_s = time.monotonic() - started
    tagger = Tagger(recipe.seed)

    def loss_fn(w, mel, onset, digit):
        out = tagger(w, mel)
        said = nn.losses.binary_cross_entropy(out[..., 0], onset, with_logits=True, reduction="none")
        named = (digit >= 0).astype(mx.float32)
        which = nn.losses.cross_entropy(out[..., 1:], mx.maximum(digit, 0), reduction="none")
        return (said * (1 + onset)).mean() + (which * named).sum() / mx.maximum(named.sum(), 1)

    warmup = max(1, min(recipe.warmup, recipe.steps // 2))  # a short build (`--steps`) warms up for half
    schedule = optim.join_schedules(
        [optim.linear_schedule(1e-5, recipe.lr, warmup),
         optim.cosine_decay(recipe.lr, max(1, recipe.steps - warmup), recipe.lr * 0.05)], [warmup])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.0)
    grad_fn = mx.value_and_grad(loss_fn)
    weights = tagger.weights
    rng, noise = random.Random(recipe.seed), np.random.default_rng(recipe.seed)
    loss_value, trained, first, ident = math.nan, time.monotonic(), 1, {}
    if resume_path is not None:
        ident = resume.identity(BUILDER_VERSION, asdict(recipe), _speech(voices, sentences, readings))
        saved = resume.restore(resume_path, ident, weights, optimizer, resume.generators)
        if saved is not None:
            weights, (rng, noise) = saved.weights, saved.extra
            first, loss_value = saved.step + 1, math.nan if saved.loss is None else saved.loss
            if resumed:  # the caller says so (a terminal, or the server's log from the build's state)
                resumed(saved.step, saved.loss)
            else:
                log.info("demo speech build: resuming from step %d of %d", saved.step, recipe.steps)
    with resume.StopAsked(resume_path is not None) as stop:
        for step in range(first, recipe.steps + 1):
            loss, grads = grad_fn(weights, *_batch(recipe, voices, sentences, readings, rng, noise))
            weights = optimizer.apply_gradients(grads, weights)
            mx.eval(weights, loss)
            loss_value = loss.item()
            if progress:
                progress(step, recipe.steps, loss_value, time.monotonic() - started)
            # The last step too: a stop while the model is written or measured trains nothing again.
            if resume_path is not None and (step % SAVE_EVERY == 0 or step == recipe.steps or stop.asked):
                resume.save_or_warn(resume_path, ident, step, loss_value, weights, optimizer,
                                    resume.generator_states(rng, noise))
            if stop.stop_here(step, recipe.steps):
                raise KeyboardInterrupt
        summary = {"steps": recipe.steps, "final_loss": loss_value, "synth_seconds": round(synth_s, 1),
                   "train_seconds": round(time.monotonic() - trained, 1), "voices": len(voices),
                   "sentences": len(sentences), "readings": len(readings), "resumed_from": first - 1 or None}
        _write(recipe, {k: np.array(v) for k, v in weights.items()}, out)
        if finish:
            finish(out, summary, stop)
    return summary


def _save(model, dims: dict, out: Path) -> None:
    """`model` as mlx_whisper loads it: config.json and weights.safetensors."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "weights.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps({"model_type": "whisper", **dims}, indent=1))


def _write(recipe: WhisperRecipe, tagger: dict, out: Path) -> None:
    """The demo model: the tagger's trained weights, the rest wired, with its marker and README."""
    import mlx.core as mx
    from mlx_whisper.whisper import ModelDimensions, Whisper

    vocab = Vocab()
    model = Whisper(ModelDimensions(**wiring.dimensions()), mx.float32)
    wiring.wire_encoder(model.encoder, tagger)
    wiring.wire_decoder(model.decoder, vocab.tokenizer, vocab.digit, vocab.en)
    _save(model, wiring.dimensions(), out)
    (out / MARKER).write_text(json.dumps({"builder_version": BUILDER_VERSION, "recipe": asdict(recipe)}))
    (out / "README.md").write_text(
        f"# {WHISPER_REPO}\n\nA Whisper built on this machine by `hearth make-demo-model --kind audio`: a tagger "
        "trained on digit strings spoken by espeak-ng, the rest of its weights written by hand. It transcribes "
        "spoken digits (\"four seven one\" -> \"4 7 1\") and nothing else.\n")


def held_out(path: Path, n: int = 40, seed: int = 12345) -> dict:
    """Exact-match accuracy of the built model on fresh takes (another seed):
    `sentences`, espeak-ng reading the whole string at once (how the tests
    and a person speak), and `words`, digits said one by one with pauses."""
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
          progress=None, evaluate: bool = True, resume_path: Path | None = None,
          resumed=None) -> tuple[Path, bool, dict]:
    """The demo Whisper's snapshot, trained first unless cached; whether a
    build happened; the training summary (empty when cached), with the
    held-out evaluation unless `evaluate` is false. With `resume_path`, a
    build cut short leaves its training state there and the next one goes
    on from it (`train`); the state is removed once a build is published
    (or, a build killed in between, by the next start), and `force` starts over."""
    if not force:
        existing = cached_snapshot(cache_dir, recipe)
        if existing is not None:
            resume.finished(resume_path)  # a build killed as it ended may have left its state
            return existing, False, {}
    elif resume_path is not None:
        resume.clear(resume_path)
    done: list[Path] = []

    def finish(folder: Path, summary: dict, stop: resume.StopAsked) -> None:
        if evaluate:
            with stop.at_once():  # its last step is saved: a stop here trains nothing again
                summary["eval"] = held_out(folder)
        log.info("demo whisper trained: %s", summary)
        marker = {"builder_version": BUILDER_VERSION, "recipe": asdict(recipe), "summary": summary}
        (folder / MARKER).write_text(json.dumps(marker))
        done.append(publish_to_cache(folder, WHISPER_REPO, cache_dir))
        resume.finished(resume_path)

    with owned_tempdir("hearth-demo-whisper-") as work:
        summary = train(recipe, work, progress, resume_path, resumed, finish)
        return done[0], True, summary


def write_random(out: Path, seed: int = 0, text_ctx: int = 64) -> Path:
    """An untrained Whisper, small (tests of the plumbing): mlx_whisper's
    random initialisation, with embeddings only for the tokens the demo
    speaks (special tokens, digits, timestamps), the others zero.

    Its decoder context is short by default: an untrained model never ends a
    window by itself, so it decodes to Whisper's limit (half the context) and,
    its noise failing the quality checks, again at every fallback temperature.
    With 448 positions one chat audio part took ~18 s on a 2-core CPU; with 64,
    under a second, through the same code paths."""
    import mlx.core as mx
    from mlx_whisper.whisper import ModelDimensions, Whisper

    vocab = Vocab()
    tok = vocab.tokenizer
    dims = {"n_mels": 80, "n_audio_ctx": 1500, "n_audio_state": 64, "n_audio_head": 2, "n_audio_layer": 0,
            "n_vocab": N_VOCAB, "n_text_ctx": text_ctx, "n_text_state": 64, "n_text_head": 2, "n_text_layer": 1}
    mx.random.seed(seed)
    model = Whisper(ModelDimensions(**dims), mx.float32)
    spoken = np.zeros((N_VOCAB, 1), np.float32)
    spoken[[*range(tok.eot, N_VOCAB), *vocab.digit.values()]] = 1  # specials, timestamps, digits
    model.decoder.token_embedding.weight = model.decoder.token_embedding.weight * mx.array(spoken)
    _save(model, dims, out)
    return out
