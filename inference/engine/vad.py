"""Voice-activity detection: Silero VAD (v6), the gate before Whisper.

The weights are the `silero-vad` package's own (`silero_vad/data/
silero_vad_16k.safetensors`, installed with Hearth: nothing is downloaded).
The package runs them through torch (`torch.jit`), and importing it imports
torch: about 2 s and a few hundred MB in a server that otherwise never
loads torch. So the network (an STFT as a convolution, four convolutions,
one LSTM cell, a sigmoid: the package's `tinygrad_model.py` spells it out)
runs here in numpy, and `speech_spans` is the package's
`get_speech_timestamps_from_probs` without its split of over-long speech
(Whisper windows the audio itself). tests/engine/test_vad.py holds both to
the package's, probability for probability and span for span.

No Django and no MLX here: numpy and safetensors.
"""
from __future__ import annotations

import functools
import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RATE = 16000
FRAME = 512  # samples the model judges at a time (32 ms)
BLOCK = 1024  # frames computed together (33 s of audio): bounds the memory a long clip takes
CONTEXT = 64  # samples of the frame before, prepended to each
WEIGHTS = "silero_vad_16k.safetensors"


class VadUnavailable(RuntimeError):
    """The silero-vad package (its weights) is not installed."""


@dataclass(frozen=True)
class Gate:
    """A request's `vad*` fields: the threshold a frame's speech probability
    must reach, the shortest speech kept, and the silence that ends it."""
    threshold: float = 0.5
    min_speech_ms: int = 250
    min_silence_ms: int = 100
    pad_ms: int = 30


def weights_path() -> Path:
    """The package's weights file, found without importing the package (its
    __init__ imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise VadUnavailable("voice-activity detection needs the silero-vad package (pip install silero-vad)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / WEIGHTS
    if not path.is_file():
        raise VadUnavailable(f"the silero-vad package has no {WEIGHTS} (version 6 or later has it)")
    return path


@functools.cache
def _weights() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {k: v.astype(np.float32) for k, v in load_file(str(weights_path())).items()}


def _conv1d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int = 1, pad: int = 0) -> np.ndarray:
    """PyTorch's Conv1d over a batch: x (N, C, L), w (O, C, K) -> (N, O, L')."""
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(x, w.shape[2], axis=2)[:, :, ::stride]  # (N, C, L', K)
    out = np.einsum("nclk,ock->nol", windows, w, optimize=True)
    return out + b[None, :, None] if b is not None else out


class Detector:
    """The model over audio that arrives in pieces (a live take): the LSTM's
    state, the last 64 samples and a partial frame carry from one `feed` to
    the next, so the probabilities are those of the whole take at once."""

    def __init__(self) -> None:
        self.h = np.zeros(128, dtype=np.float32)
        self.c = np.zeros(128, dtype=np.float32)
        self.context = np.zeros(CONTEXT, dtype=np.float32)
        self.partial = np.zeros(0, dtype=np.float32)
        self.probs: list[float] = []  # every frame's so far
        self.samples = 0  # audio fed so far
        self._lock = threading.Lock()  # one feed at a time (a cancelled request's thread may still run)

    def feed(self, samples: np.ndarray, final: bool = False) -> np.ndarray:
        """The probabilities of the frames `samples` completes (with `final`,
        the last partial frame too, padded with silence)."""
        with self._lock:
            audio = np.asarray(samples, dtype=np.float32).reshape(-1)
            step = BLOCK * FRAME
            pieces = [self._feed(audio[at:at + step], final and at + step >= len(audio))
                      for at in range(0, max(len(audio), 1), step)]
            return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    def _feed(self, samples: np.ndarray, final: bool) -> np.ndarray:
        audio = np.concatenate([self.partial, samples])
        self.samples += len(samples)
        n = len(audio) // FRAME
        if final and len(audio) % FRAME:
            audio = np.concatenate([audio, np.zeros(FRAME - len(audio) % FRAME, dtype=np.float32)])
            n += 1
        self.partial = audio[n * FRAME:]
        if n == 0:
            return np.zeros(0, dtype=np.float32)
        probs = self._frames(np.concatenate([self.context, audio[:n * FRAME]]), n)
        self.context = audio[n * FRAME - CONTEXT:n * FRAME]
        self.probs.extend(probs.tolist())
        return probs

    def _frames(self, padded: np.ndarray, n: int) -> np.ndarray:
        w = _weights()
        # Each frame with the 64 samples before it, reflect-padded by 64 on the right.
        frames = np.lib.stride_tricks.sliding_window_view(padded, CONTEXT + FRAME)[::FRAME][:n]
        frames = np.concatenate([frames, frames[:, -2:-CONTEXT - 2:-1]], axis=1)  # (n, 640)
        # The STFT is a strided convolution: real and imaginary halves, then the magnitude.
        spec = _conv1d(frames[:, None, :], w["stft_conv.weight"], None, stride=128)  # (n, 258, 4)
        half = spec.shape[1] // 2
        x = np.sqrt(spec[:, :half] ** 2 + spec[:, half:] ** 2)
        x = np.maximum(_conv1d(x, w["conv1.weight"], w["conv1.bias"], 1, 1), 0)
        x = np.maximum(_conv1d(x, w["conv2.weight"], w["conv2.bias"], 2, 1), 0)
        x = np.maximum(_conv1d(x, w["conv3.weight"], w["conv3.bias"], 2, 1), 0)
        x = np.maximum(_conv1d(x, w["conv4.weight"], w["conv4.bias"], 1, 1), 0)[:, :, 0]  # (n, 128)
        # The LSTM cell runs frame after frame (PyTorch's gate order: input, forget, cell, output).
        gates_in = x @ w["lstm_cell.weight_ih"].T + w["lstm_cell.bias_ih"] + w["lstm_cell.bias_hh"]
        w_hh = w["lstm_cell.weight_hh"].T
        h, c = self.h, self.c
        hidden = np.empty((n, 128), dtype=np.float32)
        for t in range(n):
            i, f, g, o = np.split(gates_in[t] + h @ w_hh, 4)
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            h = _sigmoid(o) * np.tanh(c)
            hidden[t] = h
        self.h, self.c = h, c
        logits = np.maximum(hidden, 0) @ w["final_conv.weight"][0, :, 0] + w["final_conv.bias"][0]
        return _sigmoid(logits).astype(np.float32)

    def spans(self, gate: Gate = Gate()) -> list[tuple[int, int]]:
        """The speech found in what was fed so far."""
        return speech_spans(np.asarray(self.probs), self.samples, gate)


def probabilities(samples: np.ndarray) -> np.ndarray:
    """The speech probability of each 512-sample frame of 16 kHz mono audio
    (the last frame padded with silence), as the package's model gives it
    when fed the frames in order from a fresh state."""
    if len(samples) == 0:
        return np.zeros(0, dtype=np.float32)
    return Detector().feed(samples, final=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def speech_spans(probs: np.ndarray, n_samples: int, gate: Gate = Gate()) -> list[tuple[int, int]]:
    """(start, end) sample offsets of the speech in the audio the
    probabilities judged: a span opens at a frame at or above the
    threshold, closes after `min_silence_ms` below the threshold less 0.15,
    is kept when longer than `min_speech_ms`, and is padded by `pad_ms` on
    each side (half the gap where two spans are closer than that)."""
    min_speech = RATE * gate.min_speech_ms / 1000
    min_silence = RATE * gate.min_silence_ms / 1000
    pad = RATE * gate.pad_ms / 1000
    low = max(gate.threshold - 0.15, 0.01)
    spans: list[list[int]] = []
    start: int | None = None
    silent_since = 0
    for i, p in enumerate(probs):
        at = FRAME * i
        if p >= gate.threshold and silent_since:
            silent_since = 0
        if p >= gate.threshold and start is None:
            start = at
            continue
        if p < low and start is not None:
            silent_since = silent_since or at
            if at - silent_since < min_silence:
                continue
            if silent_since - start > min_speech:
                spans.append([start, silent_since])
            start, silent_since = None, 0
    if start is not None and n_samples - start > min_speech:
        spans.append([start, n_samples])
    for k, span in enumerate(spans):
        if k == 0:
            span[0] = int(max(0, span[0] - pad))
        if k < len(spans) - 1:
            gap = spans[k + 1][0] - span[1]
            if gap < 2 * pad:
                span[1] += int(gap // 2)
                spans[k + 1][0] = int(max(0, spans[k + 1][0] - gap // 2))
            else:
                span[1] = int(min(n_samples, span[1] + pad))
                spans[k + 1][0] = int(max(0, spans[k + 1][0] - pad))
        else:
            span[1] = int(min(n_samples, span[1] + pad))
    return [(s, e) for s, e in spans]


def detect(samples: np.ndarray, gate: Gate = Gate()) -> list[tuple[int, int]]:
    """The speech spans of 16 kHz mono audio (sample offsets)."""
    return speech_spans(probabilities(samples), len(samples), gate)
