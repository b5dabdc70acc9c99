"""Speech to text with mlx-whisper, beside the chat model.

`Transcriber` is the service: it loads the Whisper checkpoint on first use,
unloads it when idle (or when asked), counts loads, unloads and requests,
and runs every MLX call through `run` — the engine's `exclusive`, so a
transcription never overlaps chat decoding and every MLX call happens on
the engine thread (MLX streams are thread-local). Nothing here calls MLX
from the caller's thread.

Audio arrives as 16 kHz mono float32 numpy (decoded by core.audio) and is
transcribed in 30 s windows, Whisper's own input size: each window is one
call of mlx_whisper's `transcribe`, its segments shifted to the window's
place in the take and the previous window's text given as its prompt.
Long takes thereby report progress window by window, and live sessions
transcribe each window as soon as it is complete.

No Django here (the engine boundary).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from inference.engine import vad
from inference.engine.errors import EngineError

log = logging.getLogger("hearth.speech")

RATE = 16000
WINDOW = 30 * RATE  # samples per window
SHORTEST = RATE // 10  # clips under 0.1 s are refused
PROMPT_TOKENS = 223  # the prompt's last tokens kept (Whisper's n_text_ctx // 2 - 1)
TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


class NoWhisperModel(EngineError):
    status = 503
    type = "model_unavailable"
    code = "model_unavailable"


class WhisperLoadError(EngineError):
    status = 500
    type = "server_error"


@dataclass(frozen=True)
class Options:
    task: str = "transcribe"  # or "translate" (English output)
    language: str | None = None  # None: detected from the first window
    prompt: str | None = None
    temperature: float | tuple[float, ...] = TEMPERATURES
    words: bool = False  # word timestamps (mlx-whisper's `word_timestamps`: cross-attention alignment)
    condition_on_previous_text: bool = True  # the text so far is the next window's prompt
    no_speech_threshold: float | None = 0.6  # a window this likely silent (and unsure) is skipped
    without_timestamps: bool = False  # decode text only: one segment per window
    vocabulary: tuple[str, ...] = ()  # recognition hints, fitted whole-term into the prompt after `prompt`


def resolve(ref: str) -> Path:
    """A local directory, or a repo id already in the HF cache (never downloaded)."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    if ref.count("/") == 1:
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(repo_id=ref, local_files_only=True))
        except Exception as exc:  # not in the cache, or the cache is unreadable
            raise NoWhisperModel(f"Whisper model {ref} is not in the local HF cache ({type(exc).__name__}); "
                                 f"download it with `hearth get {ref}`") from None
    raise NoWhisperModel(f"Whisper model {ref!r} is neither a directory nor a repo id")


def load(ref: str):
    """mlx_whisper's Whisper for `ref`, float32 (the CPU's fast dtype). Engine thread."""
    import mlx.core as mx
    from mlx_whisper.load_models import load_model

    path = resolve(ref)
    if not (path / "config.json").exists():
        raise NoWhisperModel(f"{ref} has no config.json: not an mlx-whisper checkpoint")
    try:
        return load_model(str(path), dtype=mx.float32)
    except Exception as exc:
        raise WhisperLoadError(f"loading Whisper model {ref} failed: {exc}") from exc


def transcribe_window(model, audio: np.ndarray, options: Options, prompt: str | None = None) -> dict:
    """One window (at most 30 s) through mlx_whisper's `transcribe`. Engine thread.

    mlx_whisper keeps its model in a class-level holder keyed by path; the
    holder is pointed at `model` for the call, so nothing is loaded twice."""
    import importlib

    mw = importlib.import_module("mlx_whisper.transcribe")  # the module (the package exports a function by that name)
    key = f"hearth:{id(model)}"
    mw.ModelHolder.model, mw.ModelHolder.model_path = model, key
    try:
        return mw.transcribe(audio[:WINDOW], path_or_hf_repo=key, verbose=None, temperature=options.temperature,
                             initial_prompt=prompt, language=options.language, task=options.task, fp16=False,
                             condition_on_previous_text=options.condition_on_previous_text,
                             word_timestamps=options.words, no_speech_threshold=options.no_speech_threshold,
                             without_timestamps=options.without_timestamps)
    finally:
        mw.ModelHolder.model, mw.ModelHolder.model_path = None, None


@dataclass
class Take:
    """A transcription in progress: windows done so far, their segments and text."""

    options: Options
    segments: list[dict] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    language: str | None = None
    windows: int = 0

    @property
    def text(self) -> str:
        return "".join(self.texts).strip()

    vocabulary: dict | None = None  # what of the vocabulary fitted the prompt (`fit_vocabulary`), once known
    vad: dict | None = None  # what the voice-activity gate found (`vad: true`): speech, its spans, its time

    def prompt(self, tokenizer) -> str | None:
        """The user's prompt and the vocabulary that fits, then (conditioning on
        it) the text so far: at most PROMPT_TOKENS tokens, trimmed from the front
        of the text so far, never from the prompt and vocabulary."""
        head = " ".join(p for p in (self.options.prompt, self.fit_vocabulary(tokenizer)) if p)
        if not self.options.condition_on_previous_text or not self.text:
            return head or None
        room = PROMPT_TOKENS - (len(tokenizer.encode(" " + head)) if head else 0)
        tail = tokenizer.encode(" " + self.text)[-room:] if room > 0 else []
        return " ".join(p for p in (head, tokenizer.decode(tail).strip()) if p) or None

    def fit_vocabulary(self, tokenizer) -> str:
        """The vocabulary's terms, whole, in order, that fit the prompt's token
        budget after the user's prompt; what fitted is kept in `vocabulary`."""
        terms = self.options.vocabulary
        if not terms:
            return ""
        used = len(tokenizer.encode(" " + self.options.prompt)) if self.options.prompt else 0
        included: list[str] = []
        omitted: list[str] = []
        for term in terms:
            cost = len(tokenizer.encode(" " + ", ".join([*included, term])))
            (included if used + cost <= PROMPT_TOKENS else omitted).append(term)
        count = len(tokenizer.encode(" " + ", ".join(included))) if included else 0
        self.vocabulary = {"included": included, "omitted": omitted, "token_count": count,
                           "token_budget": PROMPT_TOKENS - used}
        return ", ".join(included)

    def add(self, result: dict, offset_samples: int) -> list[dict]:
        """Record one window's result; returns its segments, placed in the take."""
        offset_s = offset_samples / RATE
        seek = offset_samples // 160
        added = []
        for seg in result.get("segments", []):
            seg = {**seg, "id": len(self.segments), "seek": seg.get("seek", 0) + seek,
                   "start": round(seg["start"] + offset_s, 3), "end": round(seg["end"] + offset_s, 3)}
            words = seg.pop("words", None)
            if self.options.words:
                seg["words"] = [{"word": w["word"], "start": round(w["start"] + offset_s, 3),
                                 "end": round(w["end"] + offset_s, 3), "probability": round(w["probability"], 4)}
                                for w in words or []]
            self.segments.append(seg)
            added.append(seg)
        self.texts.append(result.get("text", ""))
        if self.language is None:
            self.language = result.get("language")
        self.windows += 1
        return added

    def window(self, model, audio: np.ndarray, offset: int) -> list[dict]:
        """Transcribe one window of the take (engine thread); returns its segments."""
        options = self.options
        if self.language is not None and options.language is None:
            options = replace(options, language=self.language)
        return self.add(transcribe_window(model, audio, options, self.prompt(tokenizer(model, options))), offset)


def tokenizer(model, options: Options):
    """mlx-whisper's tokenizer for `model`, as its `transcribe` builds it (to count a prompt's tokens)."""
    from mlx_whisper.tokenizer import get_tokenizer

    return get_tokenizer(model.is_multilingual, num_languages=model.num_languages,
                         language=options.language or "en", task=options.task)


def windows(n_samples: int) -> list[int]:
    """Window start offsets covering `n_samples`."""
    return list(range(0, max(n_samples, 1), WINDOW))


class Transcriber:
    """The Whisper model beside the chat model: lazily loaded, unloaded when
    idle for `idle_unload_s` (0: kept) or on request, its use counted.

    `run(fn)` must run `fn` on the engine thread alone and answer a Future
    (Engine.exclusive). Every method that touches MLX goes through it."""

    def __init__(self, ref: str | None, run: Callable[[Callable[[], Any]], Future], idle_unload_s: float = 300.0):
        self.ref, self._run, self.idle_unload_s = ref, run, idle_unload_s
        self._model: Any = None  # touched on the engine thread only
        self.loads = self.unloads = self.requests = 0
        self.last_load_ms: float | None = None
        self.last_used = time.monotonic()
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self.ref is not None

    @property
    def resident(self) -> bool:
        return self._model is not None

    def stats(self) -> dict:
        return {"model": self.ref, "resident": self.resident, "loads": self.loads, "unloads": self.unloads,
                "requests": self.requests, "last_load_ms": self.last_load_ms, "idle_unload_sec": self.idle_unload_s}

    def require(self) -> str:
        if self.ref is None:
            raise NoWhisperModel("no Whisper model is configured for transcription; start the server with "
                                 "`--whisper-model REPO_OR_DIR` (the demo: `hearth make-demo-model --kind audio`, "
                                 "then `--whisper-model hearth/demo-whisper`)")
        return self.ref

    # -- engine thread ---------------------------------------------------
    def model(self):
        """The loaded model, loading it first (engine thread). Returns (model, load_ms)."""
        if self._model is not None:
            return self._model, 0.0
        started = time.monotonic()
        self._model = load(self.require())
        self.loads += 1
        self.last_load_ms = round((time.monotonic() - started) * 1000, 1)
        log.info("whisper model %s loaded in %.0f ms", self.ref, self.last_load_ms)
        return self._model, self.last_load_ms

    def _drop(self) -> bool:
        if self._model is None:
            return False
        import mlx.core as mx

        self._model = None
        mx.clear_cache()
        self.unloads += 1
        log.info("whisper model %s unloaded", self.ref)
        return True

    # -- any thread --------------------------------------------------------
    def submit(self, fn: Callable[[Any], Any]) -> Future:
        """Run `fn(model)` on the engine thread with the model loaded; the
        Future answers `(result, load_ms)`."""
        self.require()

        def call():
            model, load_ms = self.model()
            try:
                return fn(model), load_ms
            finally:
                self.touch()

        return self._run(call)

    def unload(self) -> Future:
        """Page the weights out now; the Future answers whether they were in."""
        return self._run(self._drop)

    def touch(self) -> None:
        """Note a use; (re)arm the idle unload."""
        with self._lock:
            self.last_used = time.monotonic()
            if self.idle_unload_s > 0 and self._timer is None:
                self._arm(self.idle_unload_s)

    def _arm(self, delay: float) -> None:
        self._timer = threading.Timer(delay, self._idle_check)
        self._timer.daemon = True
        self._timer.start()

    def _idle_check(self) -> None:
        with self._lock:
            self._timer = None
            idle = time.monotonic() - self.last_used
            if idle < self.idle_unload_s:
                self._arm(max(self.idle_unload_s - idle, 1.0))
                return
        try:
            self.unload()
        except EngineError:  # the engine is closing or busy with queued calls; try again later
            with self._lock:
                if self._timer is None:
                    self._arm(self.idle_unload_s)

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


MAX_SESSIONS = 64
SESSION_TTL_S = 600.0  # a session untouched this long is dropped (finished ones too)


@dataclass
class Session:
    """A live take (`/v1/audio/sessions`): audio arrives in chunks, each
    complete 30 s window is transcribed as soon as it is there."""

    id: str
    take: Take
    response_format: str = "json"
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # not yet transcribed
    offset: int = 0  # samples transcribed (the start of `pending` in the take)
    finished: bool = False
    touched: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one chunk at a time, in arrival order
    events: list = field(default_factory=list)  # what the session's event stream sends, in order
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set (and replaced) when events grow
    closed: bool = False  # finished or deleted: its event stream ends after the last event
    gate: vad.Gate | None = None  # `vad: true`: no window is transcribed until speech is heard
    detector: vad.Detector = field(default_factory=vad.Detector)  # the take's speech so far (`speech`)
    vad_ms: float = 0.0  # what judging the chunks took

    speech: bool = False  # speech was heard in the take (kept once true: judging it again costs)

    def heard(self) -> list[tuple[int, int]]:
        """The speech spans of the take so far (by the session's gate, or the default one)."""
        spans = self.detector.spans(self.gate or vad.Gate())
        self.speech = self.speech or bool(spans)
        return spans

    def publish(self, *events, close: bool = False) -> None:
        """Add events for the session's listeners and wake them."""
        self.events.extend(events)
        self.closed = self.closed or close
        self.changed.set()
        self.changed = asyncio.Event()

    @property
    def samples(self) -> int:
        return self.offset + len(self.pending)

    def add(self, samples: np.ndarray) -> None:
        self.pending = np.concatenate([self.pending, samples.astype(np.float32)])
        self.touched = time.monotonic()

    def full_window(self) -> tuple[np.ndarray, int] | None:
        """The next complete window and its offset, taken out of `pending`; None if none is complete."""
        if len(self.pending) < WINDOW:
            return None
        chunk, offset = self.pending[:WINDOW], self.offset
        self.pending, self.offset = self.pending[WINDOW:], self.offset + WINDOW
        return chunk, offset

    def rest(self) -> tuple[np.ndarray, int] | None:
        """What is left after the last full window, if it is long enough to transcribe."""
        chunk, offset = self.pending, self.offset
        self.pending, self.offset = self.pending[:0], self.offset + len(chunk)
        return (chunk, offset) if len(chunk) >= SHORTEST else None


class Sessions:
    """The open live sessions of one process (at most MAX_SESSIONS)."""

    def __init__(self):
        self._items: dict[str, Session] = {}

    def sweep(self) -> None:
        cutoff = time.monotonic() - SESSION_TTL_S
        for key in [k for k, s in self._items.items() if s.touched < cutoff]:
            del self._items[key]

    @property
    def open(self) -> int:
        return sum(1 for s in self._items.values() if not s.finished)

    def add(self, session: Session) -> bool:
        """Keep `session`; False when MAX_SESSIONS are already open."""
        self.sweep()
        if self.open >= MAX_SESSIONS:
            return False
        self._items[session.id] = session
        return True

    def get(self, key: str) -> Session | None:
        self.sweep()
        return self._items.get(key)

    def drop(self, key: str) -> bool:
        return self._items.pop(key, None) is not None
