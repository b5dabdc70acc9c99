"""Spoken digit strings for the demo Whisper: espeak-ng reads digits aloud
in many voices, speeds and pitches; the clips become 16 kHz float32 mono
(Whisper's input) with the text they say ("4 7 1").

No Django and no MLX here: plain numpy, the espeak-ng program, and its
library where a word's start in fluent speech is wanted (`read`).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import io
import itertools
import os
import random
import shutil
import threading
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core import procs

RATE = 16000
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
VOICES = ("en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan", "en-gb-x-gbcwmd")
VARIANTS = ("", "+m1", "+m2", "+m3", "+m4", "+m5", "+m7", "+f1", "+f2", "+f3", "+f4", "+klatt")


class SpeechSynthesisMissing(RuntimeError):
    pass


@dataclass(frozen=True)
class Clip:
    digits: str  # "4 7 1"
    audio: np.ndarray  # float32, 16 kHz mono, leading and trailing silence trimmed


def espeak() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        raise SpeechSynthesisMissing("espeak-ng is not installed (apt-get install espeak-ng; `make deps` does it)")
    return path


def wav_to_float(data: bytes) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV's samples (mono mix) as float32 in [-1, 1], with its rate."""
    with wave.open(io.BytesIO(data)) as w:
        rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
        frames = w.readframes(w.getnframes())
    if width != 2:
        raise ValueError(f"expected 16-bit PCM, got {8 * width}-bit")
    samples = np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0
    return samples.reshape(-1, channels).mean(axis=1), rate


def resample(audio: np.ndarray, rate: int, target: int = RATE) -> np.ndarray:
    """Linear-interpolation resampling (enough for synthetic speech)."""
    if rate == target or len(audio) == 0:
        return audio.astype(np.float32)
    n = int(round(len(audio) * target / rate))
    return np.interp(np.linspace(0, len(audio) - 1, n), np.arange(len(audio)), audio).astype(np.float32)


def trim(audio: np.ndarray, floor: float = 0.01) -> np.ndarray:
    loud = np.flatnonzero(np.abs(audio) > floor)
    return audio[loud[0]:loud[-1] + 1] if len(loud) else audio[:0]


def say(text: str, voice: str = "en", speed: int = 160, pitch: int = 50, word_gap: int = 0) -> np.ndarray:
    """`text` spoken by espeak-ng, as 16 kHz float32 mono (`word_gap`: a
    pause between words, in espeak-ng's units of 10 ms)."""
    gap = ["-g", str(word_gap)] if word_gap else []
    done = procs.run([espeak(), "-v", voice, "-s", str(speed), "-p", str(pitch), *gap, "--stdout", text],
                     hide=procs.SECRET_ENV, capture_output=True, timeout=60, check=True)
    audio, rate = wav_to_float(done.stdout)
    return resample(audio, rate)


def said(calls: Iterator[tuple], batch: int = 64) -> Iterator[tuple[tuple, np.ndarray]]:
    """`say(*call)` for each call, in order, with up to one espeak-ng
    process a core at a time (a clip is a process start, about 15 ms of
    mostly the system's time: one at a time, a full build's 1,200 clips
    took 20 s on 2 cores). Calls are drawn `batch` at a time as results are
    wanted, so a caller that stops early draws at most a batch more."""
    workers = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers, thread_name_prefix="hearth-espeak") as pool:
        while True:
            chunk = list(itertools.islice(calls, batch))
            if not chunk:
                return
            yield from zip(chunk, pool.map(lambda call: say(*call), chunk), strict=True)


class _Event(ctypes.Structure):
    """espeak-ng's `espeak_EVENT` (speak_lib.h)."""

    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", ctypes.c_char * 8)]


class _Library:
    """libespeak-ng through ctypes, for what its command line does not give:
    where each word starts in fluent speech (its word events, sample
    exact). No packaged Python binding exposes them (phonemizer reads
    phonemes only; pyttsx3 plays audio out loud); the C API is five calls.
    The library keeps one global voice and callback, hence the lock."""

    SYNCHRONOUS, DONT_EXIT, EVENT_END_OF_LIST, EVENT_WORD = 2, 0x8000, 0, 1  # DONT_EXIT: fail, not exit(1)
    RATE_PARAM, PITCH_PARAM = 1, 3
    CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))

    def __init__(self):
        self.lib = ctypes.CDLL(self._path())
        self.rate = self.lib.espeak_Initialize(self.SYNCHRONOUS, 0, None, self.DONT_EXIT)
        if self.rate <= 0 or self.lib.espeak_SetVoiceByName(b"en") != 0:
            raise SpeechSynthesisMissing("libespeak-ng did not start (its data files are missing?)")
        self.lock = threading.Lock()
        self.samples: list[np.ndarray] = []
        self.words: list[int] = []
        self.callback = self.CALLBACK(self._heard)  # kept: the library calls it for as long as it lives
        self.lib.espeak_SetSynthCallback(self.callback)

    @staticmethod
    def _path() -> str:
        """The library: where the linker finds it, else beside the program
        (Homebrew's /opt/homebrew/lib, which `find_library` does not search)."""
        found = ctypes.util.find_library("espeak-ng")
        if found:
            return found
        program = shutil.which("espeak-ng")
        if program is not None:
            lib = Path(program).resolve().parents[1] / "lib"
            for name in ("libespeak-ng.dylib", "libespeak-ng.1.dylib", "libespeak-ng.so.1", "libespeak-ng.so"):
                if (lib / name).exists():
                    return str(lib / name)
        raise SpeechSynthesisMissing("libespeak-ng is not installed (apt-get install espeak-ng, or brew install "
                                     "espeak-ng; `make deps` does it)")

    def _heard(self, wav, n: int, events) -> int:
        if wav and n:
            self.samples.append(np.ctypeslib.as_array(wav, (n,)).copy())
        i = 0
        while events[i].type != self.EVENT_END_OF_LIST:
            if events[i].type == self.EVENT_WORD:
                self.words.append(events[i].sample)
            i += 1
        return 0

    def read(self, text: str, voice: str, speed: int, pitch: int) -> tuple[np.ndarray, list[int]]:
        with self.lock:
            self.samples, self.words = [], []
            if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ValueError(f"espeak-ng has no voice {voice!r}")
            for param, value in ((self.RATE_PARAM, speed), (self.PITCH_PARAM, pitch)):
                self.lib.espeak_SetParameter(param, value, 0)
            data = text.encode()
            self.lib.espeak_Synth(data, len(data) + 1, 0, 1, 0, 0, None, None)
            self.lib.espeak_Synchronize()
            pcm = np.concatenate(self.samples) if self.samples else np.zeros(0, np.int16)
            return pcm.astype(np.float32) / 32768.0, list(self.words)


_library: _Library | None = None
_starting = threading.Lock()  # the library starts once per process


def read(text: str, voice: str = "en", speed: int = 160, pitch: int = 50) -> tuple[np.ndarray, list[float]]:
    """`text` read aloud by libespeak-ng, as 16 kHz float32 mono with
    leading and trailing silence trimmed, and where each of its words
    starts (seconds into the trimmed audio)."""
    global _library
    with _starting:
        if _library is None:
            _library = _Library()
    audio, words = _library.read(text, voice, speed, pitch)
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    if not len(loud):
        return audio[:0], []
    first = loud[0]
    starts = [max(0.0, float(w - first) / _library.rate) for w in words]
    return resample(audio[first:loud[-1] + 1], _library.rate), starts


def spoken(digits: str) -> str:
    return " ".join(WORDS[int(d)] for d in digits.split())


def _digits(words: str) -> str:
    """`spoken`'s inverse: "four seven" -> "4 7"."""
    return " ".join(str(WORDS.index(w)) for w in words.split())


def random_digits(rng: random.Random, shortest: int = 2, longest: int = 5) -> str:
    return " ".join(str(rng.randrange(10)) for _ in range(rng.randint(shortest, longest)))


def synthesize(n: int, seed: int, max_s: float = 3.8) -> list[Clip]:
    """`n` clips of random digit strings, each in a random voice, speed and pitch."""
    rng = random.Random(seed)

    def calls():
        while True:
            digits = random_digits(rng)
            voice = rng.choice(VOICES) + rng.choice(VARIANTS)
            yield spoken(digits), voice, rng.randint(120, 220), rng.randint(20, 80)

    clips: list[Clip] = []
    for call, audio in said(calls(), batch=max(1, min(64, n))):
        audio = trim(audio)
        if RATE // 10 < len(audio) < max_s * RATE:
            clips.append(Clip(_digits(call[0]), audio))
            if len(clips) == n:
                break
    return clips


def augment(clip: np.ndarray, rng: np.random.Generator, lead_s: float = 0.6) -> np.ndarray:
    """A clip as a recording might hold it: some silence before, another
    level, a little noise."""
    return placed(clip, rng, lead_s)[0]


def placed(clip: np.ndarray, rng: np.random.Generator, lead_s: float = 0.6) -> tuple[np.ndarray, float]:
    """`augment`'s recording, and how far into it the clip starts (seconds)."""
    lead = np.zeros(int(rng.uniform(0, lead_s) * RATE), np.float32)
    tail = np.zeros(int(rng.uniform(0.1, 0.5) * RATE), np.float32)
    audio = np.concatenate([lead, clip * rng.uniform(0.3, 1.2), tail])
    if rng.random() < 0.5:
        audio = audio + rng.normal(0, rng.uniform(0.0005, 0.01), len(audio)).astype(np.float32)
    return np.clip(audio, -1, 1).astype(np.float32), len(lead) / RATE


def to_wav(audio: np.ndarray, rate: int = RATE) -> bytes:
    """float32 samples as a 16-bit PCM mono WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


@dataclass(frozen=True)
class Voice:
    """One speaker: each digit word as espeak-ng says it in this voice, speed and pitch."""

    words: tuple[np.ndarray, ...]


def voices(n: int, seed: int) -> list[Voice]:
    rng = random.Random(seed)
    speakers = []
    for _ in range(n):
        voice = rng.choice(VOICES) + rng.choice(VARIANTS)
        speakers.append((voice, rng.randint(120, 220), rng.randint(20, 80)))
    words = [trim(audio) for _, audio in said((word, *speaker) for speaker in speakers for word in WORDS)]
    return [Voice(tuple(words[i:i + len(WORDS)])) for i in range(0, len(words), len(WORDS))]


def compose(voice: Voice, digits: str, rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """`digits` said by `voice` word by word with short pauses, after some
    silence; returns the audio and each word's (start, end) in seconds."""
    parts, spans, at = [], [], 0
    lead = int(rng.uniform(0.0, 0.6) * RATE)
    parts.append(np.zeros(lead, np.float32))
    at = lead
    for i, d in enumerate(digits.split()):
        if i:
            gap = int(rng.uniform(0.03, 0.3) * RATE)
            parts.append(np.zeros(gap, np.float32))
            at += gap
        word = voice.words[int(d)]
        parts.append(word)
        spans.append((at / RATE, (at + len(word)) / RATE))
        at += len(word)
    parts.append(np.zeros(int(rng.uniform(0.1, 0.5) * RATE), np.float32))
    audio = np.concatenate(parts) * rng.uniform(0.3, 1.2)
    if rng.random() < 0.5:
        audio = audio + rng.normal(0, rng.uniform(0.0005, 0.01), len(audio))
    return np.clip(audio, -1, 1).astype(np.float32), spans


def split_words(audio: np.ndarray, n: int, floor: float = 0.01, pause_s: float = 0.08) -> list[np.ndarray] | None:
    """A clip cut at its pauses into `n` words (None when it has another count)."""
    loud = np.flatnonzero(np.abs(audio) > floor)
    if not len(loud):
        return None
    breaks = np.flatnonzero(np.diff(loud) > pause_s * RATE)
    starts, ends = np.r_[loud[0], loud[breaks + 1]], np.r_[loud[breaks], loud[-1]] + 1
    return [audio[s:e] for s, e in zip(starts, ends, strict=True)] if len(starts) == n else None


def sentences(n: int, seed: int) -> list[tuple[str, list[np.ndarray]]]:
    """`n` digit strings, each read as one sentence by a random voice, speed
    and pitch, with a 250 ms pause between its words so they can be cut
    apart: words as a sentence says them (shorter than alone, the last one
    falling), for `run_together`."""
    rng = random.Random(seed)

    def calls():
        for _ in range(20 * n):
            digits = random_digits(rng)
            voice = rng.choice(VOICES) + rng.choice(VARIANTS)
            yield spoken(digits), voice, rng.randint(120, 220), rng.randint(20, 80), 25

    out: list[tuple[str, list[np.ndarray]]] = []
    for call, audio in said(calls(), batch=max(1, min(64, n))) if n else ():
        digits = _digits(call[0])
        words = split_words(audio, len(digits.split()))
        if words:
            out.append((digits, words))
            if len(out) == n:
                break
    if len(out) < n:
        raise SpeechSynthesisMissing(f"espeak-ng's word gap (-g) left {len(out)} of {n} sentences cut into their words")
    return out


def run_together(words: list[np.ndarray], rng: random.Random,
                 noise: np.random.Generator) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """A sentence's words joined as fluent speech joins them: 30 ms
    overlapping to 150 ms apart, after some silence; the audio and each
    word's (start, end) in seconds."""
    at = int(rng.uniform(0.0, 0.6) * RATE)
    out = np.zeros(at + sum(len(w) for w in words) + RATE, np.float32)
    spans = []
    for i, word in enumerate(words):
        if i:
            at += int(rng.uniform(-0.03, 0.15) * RATE)
        out[at:at + len(word)] += word
        spans.append((at / RATE, (at + len(word)) / RATE))
        at += len(word)
    audio = out[:at + int(rng.uniform(0.1, 0.5) * RATE)] * rng.uniform(0.3, 1.2)
    if rng.random() < 0.5:
        audio = audio + noise.normal(0, rng.uniform(0.0005, 0.01), len(audio))
    return np.clip(audio, -1, 1).astype(np.float32), spans


@dataclass(frozen=True)
class Reading:
    """A digit string read fluently, with where each word starts (seconds)."""

    digits: str
    audio: np.ndarray
    starts: tuple[float, ...]


def readings(n: int, seed: int, max_s: float = 3.8) -> list[Reading]:
    """`n` digit strings read as sentences (as `synthesize` reads them), each
    in a random voice, speed and pitch, with libespeak-ng's word onsets."""
    rng = random.Random(seed)
    out: list[Reading] = []
    for _ in range(20 * n):
        if len(out) == n:
            break
        digits = random_digits(rng)
        voice = rng.choice(VOICES) + rng.choice(VARIANTS)
        audio, starts = read(spoken(digits), voice, rng.randint(120, 220), rng.randint(20, 80))
        if RATE // 10 < len(audio) < max_s * RATE and len(starts) == len(digits.split()):
            out.append(Reading(digits, audio, tuple(starts)))
    if len(out) < n:
        raise SpeechSynthesisMissing(f"libespeak-ng gave {len(out)} of {n} readings with one word event a word")
    return out
