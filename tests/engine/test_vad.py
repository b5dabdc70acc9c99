"""The voice-activity gate (inference/engine/vad.py) against the silero-vad
package it is ported from: the numpy network gives the package's torch
model's probabilities when it has that model's weights, and with the
torch-free weights the package ships it finds the same speech in real
speech (espeak-ng), and none in silence or noise."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import silero_vad as silero  # a dependency of Hearth's: the weights' package (it imports torch)
import torch

from inference.engine import vad
from serving.demo import speech_data

RATE = 16000


@pytest.fixture(scope="module")
def take() -> np.ndarray:
    """2 s of silence, four words, 1 s of faint noise, one word, 0.5 s of silence."""
    noise = np.random.default_rng(0).normal(0, 0.01, RATE).astype(np.float32)
    return np.concatenate([np.zeros(2 * RATE, np.float32), speech_data.say("four seven one two", voice="en-us"),
                           noise, speech_data.say("nine", voice="en"), np.zeros(RATE // 2, np.float32)])


@pytest.fixture(scope="module")
def package():
    return silero.load_silero_vad()


def _package_probs(model, audio: np.ndarray) -> np.ndarray:
    model.reset_states()
    out = []
    for start in range(0, len(audio), vad.FRAME):
        chunk = torch.from_numpy(audio[start:start + vad.FRAME].copy())
        chunk = torch.nn.functional.pad(chunk, (0, vad.FRAME - len(chunk)))
        out.append(model(chunk, RATE).item())
    return np.array(out)


def _jit_weights(model) -> dict[str, np.ndarray]:
    """The package's torch model's weights, under the names of its safetensors export."""
    tensors = {k: v.detach().numpy() for k, v in model._model.named_parameters()}
    tensors.update({k: v.numpy() for k, v in model._model.named_buffers()})
    names = {"stft.forward_basis_buffer": "stft_conv.weight", "decoder.decoder.2.weight": "final_conv.weight",
             "decoder.decoder.2.bias": "final_conv.bias"}
    names.update({f"decoder.rnn.{p}": f"lstm_cell.{p}" for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
    names.update({f"encoder.{i}.reparam_conv.{p}": f"conv{i + 1}.{p}" for i in range(4) for p in ("weight", "bias")})
    assert set(names) <= set(tensors)
    return {names[k]: v for k, v in tensors.items() if k in names}


def test_the_network_is_the_packages_frame_for_frame(take, package, monkeypatch):
    weights = _jit_weights(package)
    monkeypatch.setattr(vad, "_weights", functools.cache(lambda: weights))
    mine = vad.probabilities(take)
    theirs = _package_probs(package, take)
    assert mine.shape == theirs.shape == (-(-len(take) // vad.FRAME),)
    assert np.abs(mine - theirs).max() < 1e-4


def test_its_spans_are_the_packages_for_the_same_probabilities(take, package):
    probs = _package_probs(package, take)
    for gate in (vad.Gate(), vad.Gate(threshold=0.3, min_speech_ms=100, min_silence_ms=300, pad_ms=100)):
        theirs = silero.get_speech_timestamps_from_probs(
            list(probs), threshold=gate.threshold, min_speech_duration_ms=gate.min_speech_ms,
            min_silence_duration_ms=gate.min_silence_ms, speech_pad_ms=gate.pad_ms, audio_length_samples=len(take))
        assert vad.speech_spans(probs, len(take), gate) == [(s["start"], s["end"]) for s in theirs]


def test_the_shipped_weights_find_the_speech_and_nothing_else(take, package):
    found = vad.detect(take)
    theirs = silero.get_speech_timestamps(torch.from_numpy(take), package)
    assert len(found) == len(theirs) == 2
    for (start, end), span in zip(found, theirs, strict=True):  # within 40 ms of the package's own model
        assert abs(start - span["start"]) <= 640 + vad.FRAME and abs(end - span["end"]) <= 640 + vad.FRAME
    first_word = 2 * RATE
    assert found[0][0] <= first_word + vad.FRAME * 4 and found[0][0] >= first_word - RATE // 2
    rng = np.random.default_rng(1)
    for quiet in (np.zeros(3 * RATE, np.float32), rng.normal(0, 0.02, 3 * RATE).astype(np.float32),
                  0.2 * np.sin(2 * np.pi * 440 * np.arange(3 * RATE) / RATE).astype(np.float32)):
        assert vad.detect(quiet) == []


def test_a_take_fed_in_pieces_is_judged_as_the_whole(take):
    whole = vad.probabilities(take)
    detector = vad.Detector()
    pieces = [detector.feed(take[start:start + 3001]) for start in range(0, len(take) - 3001, 3001)]
    pieces.append(detector.feed(take[len(pieces) * 3001:], final=True))
    assert np.abs(np.concatenate(pieces) - whole).max() < 1e-5
    assert detector.spans() == vad.detect(take)
