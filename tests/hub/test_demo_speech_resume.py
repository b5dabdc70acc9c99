"""A demo speech build cut short goes on where it stopped, as the chat
build does (test_demo_resume.py): a tiny recipe (2 voices, 6 steps of 2
clips) trained in this process in seconds, killed
after a save or stopped by a real signal mid-build or while it measures
the model, then built again: the second build trains only the steps left,
its generators where the first left them, and writes the model an
uninterrupted build writes, byte for byte. Another recipe's or other
speech's state is deleted and the build starts at step 0, as with
`force`; the server says where a build goes on from and where one stopped.
A stop as the finished model is written or published waits for it (the
build ends finished), a start that finds the finished model removes the
state a kill left, and a build ended by a signal is logged as stopped."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from core import home
from hearth import demo_training
from hearth.root import RUNTIME as runtime
from serving.demo import resume
from serving.demo import whisper_build as speech
from tests.hub.test_demo_resume import Killed

# Digits said alone only (`fluent` 0): libespeak-ng's fluent readings depend on what the process read
# before (the same in each fresh build process, so a build and its resumption agree), and the builds
# of one test run in one process.
TINY = replace(speech.WhisperRecipe(), voices=2, sentences=0, readings=0, fluent=0.0, steps=6, batch=2, warmup=2)


@pytest.fixture(autouse=True)
def save_often(monkeypatch):
    """A save every 2 steps of TINY's 6."""
    monkeypatch.setattr(speech, "SAVE_EVERY", 2)


def _weights(snapshot: Path) -> bytes:
    return (snapshot / "weights.safetensors").read_bytes()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> bytes:
    """TINY built in one go, saving its training state as it goes: its weights' bytes."""
    state = tmp_path_factory.mktemp("state") / "audio.safetensors"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(speech, "SAVE_EVERY", 2)
        snapshot, built, summary = speech.build(tmp_path_factory.mktemp("plain"), TINY, evaluate=False,
                                                resume_path=state)
    assert built and summary["resumed_from"] is None and not state.exists()  # a finished build leaves none
    return _weights(snapshot)


def _build(cache: Path, state: Path):
    """Build TINY: its snapshot, and the steps trained and resumed from."""
    seen: dict[str, list] = {"progress": [], "resumed": []}
    snapshot, built, summary = speech.build(
        cache, TINY, evaluate=False, resume_path=state,
        progress=lambda step, total, loss, seconds: seen["progress"].append(step),
        resumed=lambda step, loss: seen["resumed"].append(step))
    assert built and summary["resumed_from"] == (seen["resumed"] or [None])[0]
    assert not state.exists()  # a finished build leaves none
    return snapshot, seen


def test_a_build_killed_after_a_save_trains_only_the_steps_left(uninterrupted, tmp_path):
    state = tmp_path / "audio.safetensors"

    def progress(step, total, loss, seconds):
        if step == 5:  # after the save at step 4: the draws of step 5 are made again from the saved generators
            raise Killed

    with pytest.raises(Killed):
        speech.build(tmp_path, TINY, evaluate=False, progress=progress, resume_path=state)
    assert resume.saved_step(state) == 4 and speech.cached_snapshot(tmp_path, TINY) is None
    snapshot, seen = _build(tmp_path, state)
    assert seen["resumed"] == [4] and seen["progress"] == [5, 6]
    assert _weights(snapshot) == uninterrupted


def test_a_stop_mid_build_saves_the_step_it_reached(uninterrupted, tmp_path, monkeypatch, default_signals):
    """A terminal's Ctrl-C, then its server's SIGTERM (the same request): both reach the speech build's
    stop (a SIGTERM it did not catch would end this process). Each signal alone, and the two together,
    through the stop both builds share (resume.StopAsked), are test_demo_resume.py's."""
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path / "home"))
    state = home.demo_resume("audio")

    def progress(step, total, loss, seconds):
        if step == 3:  # between two saves: the step under way (here, done) is saved, then KeyboardInterrupt
            for signum in (signal.SIGINT, signal.SIGTERM):
                os.kill(os.getpid(), signum)

    with pytest.raises(KeyboardInterrupt):
        speech.build(tmp_path, TINY, evaluate=False, progress=progress, resume_path=state)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert resume.saved_step(state) == 3
    # What `hearth serve --build-demo` says as it starts the build again.
    assert demo_training.Build("audio", TINY.steps).going_on_from() == (
        "going on from step 3 of 6, where a build cut short saved its training state")
    snapshot, seen = _build(tmp_path, state)
    assert seen["resumed"] == [3] and seen["progress"] == [4, 5, 6]
    assert _weights(snapshot) == uninterrupted
    assert demo_training.Build("audio", TINY.steps).going_on_from() is None


def test_a_stop_while_the_model_is_measured_trains_nothing_again(uninterrupted, tmp_path, monkeypatch,
                                                                  default_signals):
    state = tmp_path / "audio.safetensors"

    def ctrl_c(path):  # a Ctrl-C minutes into the held-out measuring, here at once
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(speech, "held_out", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        speech.build(tmp_path, TINY, resume_path=state)
    assert resume.saved_step(state) == TINY.steps and speech.cached_snapshot(tmp_path, TINY) is None
    snapshot, seen = _build(tmp_path, state)
    assert seen["resumed"] == [TINY.steps] and seen["progress"] == []
    assert _weights(snapshot) == uninterrupted


@pytest.mark.parametrize("change", ["recipe", "speech", "force"])
def test_another_recipes_state_is_deleted_and_the_build_starts_over(uninterrupted, tmp_path, caplog, monkeypatch,
                                                                    change):
    state = tmp_path / "audio.safetensors"

    def killed_after_a_save(step, total, loss, seconds):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):  # a state at step 2, of another recipe (seed 1) or of TINY
        speech.build(tmp_path / "a", replace(TINY, seed=1) if change == "recipe" else TINY, evaluate=False,
                     progress=killed_after_a_save, resume_path=state)
    assert resume.saved_step(state) == 2
    if change == "speech":  # the same recipe, other speech (another espeak-ng): the voices in another order
        voices = speech.speech_data.voices
        monkeypatch.setattr(speech.speech_data, "voices", lambda n, seed: voices(n, seed)[::-1])
    there_at_step_1: list[bool] = []

    def progress(step, total, loss, seconds):
        if step == 1:
            there_at_step_1.append(state.exists())

    with caplog.at_level(logging.INFO, logger="hearth.demo"):
        snapshot, built, _ = speech.build(tmp_path / "b", TINY, force=change == "force", evaluate=False,
                                          progress=progress, resume_path=state)
    assert built and there_at_step_1 == [False] and not state.exists()  # deleted before the first step
    said = [r.getMessage() for r in caplog.records if "another recipe's" in r.getMessage()]
    assert len(said) == (0 if change == "force" else 1), said
    assert (_weights(snapshot) == uninterrupted) is (change != "speech")


def test_the_router_shows_where_a_speech_build_resumed_and_where_it_stopped(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(runtime, "speech_build", {"state": "starting", "steps": 400})
    training = demo_training.DemoTraining(manager=None, chat=False, speech=True)  # type: ignore[arg-type]
    assert training.speech is not None
    training.speech.progress = tmp_path / "audio.json"
    with caplog.at_level(logging.INFO, logger="hearth.serve"):
        for step in (30, 31):
            training._look_speech(training.speech, {"state": "training", "step": step, "steps": 400,
                                                    "resumed_from": 30})
        assert runtime.speech_build["resumed_from"] == 30 and runtime.speech_build["step"] == 31
        training.speech.progress.write_text(json.dumps({"state": "stopped", "step": 37, "steps": 400}))
        asyncio.run(training._speech_ended(demo_training.STOPPED))
    assert runtime.speech_build["state"] == "stopped" and runtime.speech_build["step"] == 37
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO"], caplog.records
    assert "demo speech model: resumed from step 30 of 400" in caplog.records[0].getMessage()
    assert "demo speech model: training stopped at step 37 of 400" in caplog.records[1].getMessage()


def test_a_server_that_stops_says_where_its_speech_build_stopped(monkeypatch, caplog, tmp_path):
    """`DemoTraining.stop` as the server stops: the build asked to stop exits 130 (a child that does
    as a build does), and the log says the step it saved."""
    monkeypatch.setattr(runtime, "speech_build", None)
    training = demo_training.DemoTraining(manager=None, chat=False, speech=True)  # type: ignore[arg-type]
    build = training.speech
    assert build is not None
    build.progress = tmp_path / "audio.json"
    build.progress.write_text(json.dumps({"state": "stopped", "step": 12, "steps": 400}))
    build.proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(130)); "
                               "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert build.proc.stdout is not None and build.proc.stdout.readline() == "ready\n"
    with caplog.at_level(logging.INFO, logger="hearth.serve"):
        training.stop()
    assert build.proc.returncode == demo_training.STOPPED
    assert [r.getMessage() for r in caplog.records] == [
        "demo speech model: training stopped at step 12 of 400; the next start goes on from there"]


# A speech build that has trained its last step, sent SIGTERM as it writes or publishes the finished model (a
# server or a service manager stopping it): in its own process, as `make-demo-model --background` runs it.
_STOPPED_AS_IT_ENDS = """
import os, signal, sys
from pathlib import Path
from serving.demo import whisper_build as speech
from tests.hub.test_demo_speech_resume import TINY

speech.SAVE_EVERY = 2
cache, state, where = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
original = getattr(speech, where)

def signalled(*args):
    os.kill(os.getpid(), signal.SIGTERM)
    return original(*args)

setattr(speech, where, signalled)
snapshot, built, summary = speech.build(cache, TINY, evaluate=False, resume_path=state)
print("built", snapshot, flush=True)
"""


@pytest.mark.parametrize("where", ["_write", "publish_to_cache"])
def test_a_stop_as_the_finished_model_is_written_or_published_lets_it_finish(uninterrupted, tmp_path, where):
    state, cache = tmp_path / "audio.safetensors", tmp_path / "hub"
    done = subprocess.run([sys.executable, "-c", _STOPPED_AS_IT_ENDS, str(cache), str(state), where],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    # It died with status -15 (logged as a failed build) with nothing or half of the model published; now it
    # finishes what it began and ends well, and the next start serves that model.
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    snapshot = speech.cached_snapshot(cache, TINY)
    assert snapshot is not None and "built" in done.stdout
    assert _weights(snapshot) == uninterrupted and not state.exists()
    assert speech.build(cache, TINY, evaluate=False, resume_path=state) == (snapshot, False, {})


def test_a_finished_build_left_with_its_state_is_tidied_at_the_next_start(uninterrupted, tmp_path, monkeypatch):
    """A build killed (SIGKILL) after it named the finished model, before it removed its training state:
    the next start finds the finished model and removes the state, which said a build was cut short."""
    state = tmp_path / "audio.safetensors"
    with monkeypatch.context() as killed:  # what the kill leaves: nothing after the ref is written
        killed.setattr(speech.resume, "clear", lambda path: None)
        snapshot, built, _ = speech.build(tmp_path, TINY, evaluate=False, resume_path=state)
    assert built and resume.saved_step(state) == TINY.steps
    assert speech.build(tmp_path, TINY, evaluate=False, resume_path=state) == (snapshot, False, {})
    assert not state.exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_router_logs_a_speech_build_ended_by_a_signal_as_stopped(monkeypatch, caplog, signum):
    monkeypatch.setattr(runtime, "speech_build", {"state": "training", "step": 40, "steps": 400})
    training = demo_training.DemoTraining(manager=None, chat=False, speech=True)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="hearth.serve"):
        asyncio.run(training._speech_ended(-signum))
    assert runtime.speech_build["state"] == "stopped" and "error" not in runtime.speech_build
    assert [r.getMessage() for r in caplog.records] == [
        f"demo speech model: training ended by signal {signum} at step 40 of 400; the next start goes on from "
        "the training state saved last"]


def test_speech_synthesised_side_by_side_is_what_one_clip_at_a_time_says():
    """Clips are synthesised a core at a time (`speech_data.said`), in order: the same voices and
    sentences, byte for byte, as saying them one after the other (a build's identity and its resume
    depend on it)."""
    import random as stdlib_random

    from serving.demo import speech_data

    rng = stdlib_random.Random(5)
    speakers = [(rng.choice(speech_data.VOICES) + rng.choice(speech_data.VARIANTS), rng.randint(120, 220),
                 rng.randint(20, 80)) for _ in range(3)]
    one_by_one = [speech_data.trim(speech_data.say(word, *speaker)).tobytes()
                  for speaker in speakers for word in speech_data.WORDS]
    side_by_side = [clip.tobytes() for voice in speech_data.voices(3, 5) for clip in voice.words]
    assert side_by_side == one_by_one

    rng = stdlib_random.Random(5)
    sentences = []
    while len(sentences) < 4:
        digits = speech_data.random_digits(rng)
        voice = rng.choice(speech_data.VOICES) + rng.choice(speech_data.VARIANTS)
        audio = speech_data.say(speech_data.spoken(digits), voice, rng.randint(120, 220), rng.randint(20, 80),
                                word_gap=25)
        words = speech_data.split_words(audio, len(digits.split()))
        if words:
            sentences.append((digits, [w.tobytes() for w in words]))
    assert [(digits, [w.tobytes() for w in words]) for digits, words in speech_data.sentences(4, 5)] == sentences
