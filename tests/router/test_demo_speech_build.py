"""The demo speech model built in the background of router mode (`hearth
serve --build-demo` when the library has no Whisper), in this process on
the router's own machinery: a real `make-demo-model --kind audio
--background` (2 training steps), its state followed, and the built Whisper
handed to the loaded model's process, which starts again and transcribes.
(The router's 503 while it builds, and /health, are in tests/e2e/test_orphans.py.)"""
from __future__ import annotations

import asyncio
import time

import httpx
import psutil
import pytest

from serving.demo import speech_data
from tests.helpers import TINY_REPO, build_tiny_model

pytestmark = pytest.mark.slow  # `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)


async def _until(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:g}s for {what}"
        await asyncio.sleep(0.2)


def test_the_built_whisper_reaches_the_loaded_models_process(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from hearth.demo_training import DemoTraining
    from hearth.root import RUNTIME as runtime
    from serving.demo.whisper_build import WHISPER_REPO
    from serving.router.catalog import Library
    from serving.router.manager import Manager
    from serving.router.slots import Settings

    hf = tmp_path / "hf"
    build_tiny_model(hf / "hub")  # a cache of its own: the build publishes into it
    monkeypatch.setenv("HF_HOME", str(hf))  # the build's and the model's processes
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf / "hub"))  # this process's library
    monkeypatch.setattr(runtime, "speech_build", None)
    monkeypatch.setattr(runtime, "whisper_model", None)

    async def main() -> None:
        manager = Manager(Library(None, None), Settings(models_max=1, child_args=("--no-worker",)), TINY_REPO,
                          1 << 30)
        manager.start([TINY_REPO])
        demo = DemoTraining(manager, chat=False, speech=True, speech_args=("--steps", "2"))
        try:
            slot = manager.slots[TINY_REPO]
            await _until("the model's process", lambda: slot.status == "loaded", 120)
            first = slot.child.pid
            assert "--whisper-model" not in psutil.Process(first).cmdline()
            demo.start()
            assert runtime.speech_build["state"] == "starting" and runtime.speech_build["model"] == WHISPER_REPO
            assert "make-demo-model --kind audio --background --steps 2" in " ".join(demo.speech.proc.args)
            demo.watch()
            await _until("the build", lambda: runtime.speech_build["state"] in ("done", "failed"), 300)
            assert runtime.speech_build["state"] == "done", runtime.speech_build
            assert runtime.speech_build["step"] == runtime.speech_build["steps"] == 2
            assert runtime.whisper_model == WHISPER_REPO
            assert manager.settings.child_args == ("--no-worker", "--whisper-model", WHISPER_REPO)

            # The loaded model's process starts again, once idle, with the Whisper beside it.
            await _until("the model's new process", lambda: slot.status == "loaded" and slot.child.pid != first, 120)
            assert "--whisper-model" in psutil.Process(slot.child.pid).cmdline()
            wav = speech_data.to_wav(speech_data.say("four seven"))
            async with httpx.AsyncClient(timeout=120) as http:
                heard = await http.post(f"http://127.0.0.1:{slot.port}/v1/audio/transcriptions",
                                        headers=manager.hop_headers(slot), data={"model": "whisper-1"},
                                        files={"file": ("take.wav", wav, "audio/wav")})
            assert heard.status_code == 200, heard.text
            assert isinstance(heard.json()["text"], str)  # two steps of training: what it hears is noise
        finally:
            demo.stop()
            await asyncio.to_thread(manager.stop_all, 30)

    asyncio.run(main())

