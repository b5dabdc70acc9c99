"""`hearth serve --build-demo` (what `make serve` runs): the demo models
trained in the background while the router answers, the chat model first,
then the speech model.

Each build is `hearth make-demo-model --kind K --background` (niced, tied
to the router: it ends with it), and the router watches the state it keeps
in `home.demo_build(kind)`.

The chat model: at each checkpoint the build publishes, the router takes
the model into its library, makes it the default when there is none yet,
and swaps the new weights in: a loaded demo process is restarted once no
request is running on it, or after a minute once its running requests
have finished (the next request loads the new snapshot). The
first checkpoint is the untrained model, seconds after the start (it
answers, in babble); what is served only gets better from then on, and the
last is the finished model, the same one a plain build makes. A build cut
short (the server stopped, killed, the machine rebooted) saved its
training state at its last checkpoint: the next one serves that
checkpoint and goes on training from it, not from step 0
(`resumed_from` in its state).

The speech model (built when the library has no Whisper, or only an
older build of the demo's), once the chat build has ended: when it is
published, the router hands it to its models' processes (`--whisper-model`):
the ones it starts from then on, and each loaded one, restarted once no
request is running on it (or, busy for a minute, once its running requests
have finished). Until the default model's process has it, transcription is
refused with a 503 that says how far the build is (an older build, when
the cache holds one, answers instead). A speech build cut short saved its
training state every 10 steps, and at the step reached when the server
stops it: the next one goes on from there (`resumed_from` in its state).

The progress is on `/health` and `/stats` (`demo_build`, `speech_build`),
the dashboard's Status and Models pages, and the log.
"""
from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

from huggingface_hub import constants

from core import home, procs
from hearth.root import RUNTIME as runtime
from serving.demo import resume
from serving.demo.build import DEMO_REPO, Recipe, cached_snapshot, published_step
from serving.demo.whisper_build import WHISPER_REPO, WhisperRecipe
from serving.demo.whisper_build import cached_snapshot as whisper_snapshot
from serving.router.manager import Manager
from serving.router.slots import RouterError

log = logging.getLogger("hearth.serve")
POLL_S = 1.0
BUSY_WAIT_S = 60.0  # a model busy this long is restarted anyway: its running requests finish first (its drain)
STATE_KEYS = ("state", "step", "steps", "loss", "seconds", "error")  # what /health shows of a build's state
# How long a build asked to stop may take to finish its step and save: a step takes about a second on two
# quiet cores, the save a fraction of one; niced on a busy machine the two took 4.4 s (the chat build), and
# 6.3 s from the signal to the exit at a load of 10 on 2 cores (the speech build). SIGKILL after.
STOP_WAIT_S = 10.0
STOPPED = 130  # a build's exit status once it stopped as asked (Ctrl-C, or SIGTERM from `Build.stop`)
# Ended by a signal before it could say so (a SIGTERM before its training loop, `Build.stop`'s SIGKILL, a
# service manager's kill): stopped, not failed; the next start goes on from the state it saved last.
KILLED = (-signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL, -signal.SIGHUP)


def demo_is_built() -> bool:
    """The finished demo chat model is in the HF cache."""
    return cached_snapshot(Path(constants.HF_HUB_CACHE), Recipe()) is not None


def speech_is_built() -> bool:
    """The demo speech model of this builder and recipe is in the HF cache."""
    return whisper_snapshot(Path(constants.HF_HUB_CACHE), WhisperRecipe()) is not None


def demo_checkpoint_step() -> int | None:
    """How far the published demo chat model was trained (None: none published)."""
    return published_step(Path(constants.HF_HUB_CACHE), Recipe())


class Build:
    """One background build: its process and the state it keeps."""

    def __init__(self, kind: str, steps: int, extra: Sequence[str] = ()):
        self.kind, self.steps, self.extra = kind, steps, tuple(extra)
        self.progress = home.demo_build(kind)
        self.proc: subprocess.Popen | None = None
        self.resumed_from: int | None = None  # the step it went on from, once it says so

    def start(self) -> int:
        """Start it from a thread that lives as long as the server (the
        main thread or the server's loop: see `core.procs.spawn`)."""
        self.progress.unlink(missing_ok=True)
        nice = shutil.which("nice")  # the server's requests come first
        self.proc = procs.spawn([*([nice, "-n", "10"] if nice else []), *procs.hearth_argv(),
                                 "make-demo-model", "--kind", self.kind, "--background", *self.extra],
                                stdin=subprocess.DEVNULL)
        return self.proc.pid

    def read(self) -> dict | None:
        try:
            state = json.loads(self.progress.read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def going_on_from(self) -> str | None:
        """What the server says as it starts the build, when a build cut
        short saved its training state: the step the build goes on from
        (read from the state file's header; whose recipe it is, the build
        checks)."""
        saved = resume.saved_step(home.demo_resume(self.kind))
        return None if saved is None else (f"going on from step {saved} of {self.steps}, where a build cut short "
                                           "saved its training state")

    def stop(self) -> int | None:
        """SIGTERM: a build finishes its step and saves its training state
        (`STOP_WAIT_S` at most), so the next start goes on from the step
        reached, not the last one saved before; then SIGKILL. Returns its
        exit status, or None when it was not running."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            return self.proc.wait()


class DemoTraining:
    """The background builds and what the router does with what they publish."""

    def __init__(self, manager: Manager, chat: bool = True, speech: bool = False, speech_args: Sequence[str] = ()):
        self.manager = manager
        self.chat = Build("chat", Recipe().steps) if chat else None
        self.speech = Build("audio", WhisperRecipe().steps, speech_args) if speech else None
        self.served_step: int | None = None  # the chat checkpoint the router has taken in
        # Loaded models to restart (new weights, the Whisper), and since when: once idle, or after BUSY_WAIT_S.
        self.restart_pending: dict[str, float] = {}
        self.handing_over = False  # the Whisper is built; offered once the default model's process has it
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        """Start the first build (call from the main thread, before the
        server listens). The speech build waits for the chat build."""
        if self.speech is not None:
            runtime.speech_build = {"state": "waiting" if self.chat else "starting", "step": 0,
                                    "steps": self.speech.steps, "model": WHISPER_REPO}
        if self.chat is not None:
            self._start_chat(self.chat)
        elif self.speech is not None:
            self._start_speech(self.speech)

    def _start_chat(self, build: Build) -> None:
        pid = build.start()
        self.served_step = demo_checkpoint_step()  # a build cut short before left one
        runtime.demo_build = {"state": "starting", "step": 0, "steps": build.steps, "served_step": self.served_step,
                              "resumed_from": None, "model": DEMO_REPO, "pid": pid}
        self._expect_chat()
        how_long = build.going_on_from() or "about 7 minutes on a quiet 2-core machine"
        log.info("training the demo model %s in the background (pid %d): served from its first checkpoint, "
                 "seconds from now, and swapped for each better one as it trains (%s)", DEMO_REPO, pid, how_long)

    def _expect_chat(self) -> None:
        """Until the build publishes its first checkpoint, a request that
        names the demo model, or names none while there is no default, is
        told that it is training (a 503), not that no such model exists."""
        note = (f"the demo model {DEMO_REPO} is training and is served from its first checkpoint, seconds after "
                "the start (GET /health shows the progress)")
        self.manager.coming[DEMO_REPO] = note
        if self.manager.default is None:
            self.manager.no_default_note = note

    def _start_speech(self, build: Build) -> None:
        pid = build.start()
        runtime.speech_build = {**(runtime.speech_build or {}), "state": "starting", "pid": pid}
        how_long = build.going_on_from() or "about 7 to 10 minutes on a 2-core CPU"
        log.info("training the demo speech model %s in the background (pid %d): transcription is offered "
                 "once it is built (%s)", WHISPER_REPO, pid, how_long)

    def watch(self) -> None:
        """On the server's loop: follow the builds until they end."""
        self.task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        if self.chat is not None:
            await self._follow(self.chat)
            if self.speech is not None:
                try:
                    self._start_speech(self.speech)
                except OSError as exc:
                    self._speech_failed(f"could not start the build: {exc}")
                    return
        if self.speech is not None and self.speech.proc is not None:
            await self._follow(self.speech)
        while self.restart_pending or self.handing_over:  # the last restarts wait for their models
            await asyncio.sleep(POLL_S)
            await self._restart_idle()

    async def _follow(self, build: Build) -> None:
        proc = build.proc
        assert proc is not None
        while True:
            await asyncio.sleep(POLL_S)
            code = proc.poll()
            state = build.read()
            if state is not None:
                if build is self.chat:
                    await self._look_chat(state)
                else:
                    self._look_speech(build, state)
            await self._restart_idle()
            if code is not None:
                if build is self.chat:
                    self._chat_ended(code)
                else:
                    await self._speech_ended(code)
                return

    @staticmethod
    def _resumed(build: Build, state: dict, label: str) -> int | None:
        """The step a build cut short before saved and this one went on
        from (None: it started at step 0), logged once."""
        resumed = state.get("resumed_from")
        if isinstance(resumed, int) and resumed != build.resumed_from:
            build.resumed_from = resumed
            log.info("%s: resumed from step %d of %s, where a build cut short saved its training state "
                     "(the steps before it are not trained again)", label, resumed, state.get("steps"))
        return resumed if isinstance(resumed, int) else None

    async def _look_chat(self, state: dict) -> None:
        assert self.chat is not None
        runtime.demo_build = {**(runtime.demo_build or {}), **{k: state.get(k) for k in STATE_KEYS},
                              "resumed_from": self._resumed(self.chat, state, "demo model")}
        step = state.get("served_step")
        if isinstance(step, int) and step != self.served_step:
            await self._take(step, state)

    def _look_speech(self, build: Build, state: dict) -> None:
        """"done" once the default model's process has it (`_restart_idle`)."""
        runtime.speech_build = {**(runtime.speech_build or {}), **{
            k: state.get(k) for k in STATE_KEYS if k != "state" or state.get(k) != "done"},
            "resumed_from": self._resumed(build, state, "demo speech model")}

    async def _take(self, step: int, state: dict) -> None:
        """A new checkpoint is published: into the library, the default if
        there is none, and swapped in where it is loaded."""
        self.served_step = step
        runtime.demo_build = {**(runtime.demo_build or {}), "served_step": step}
        await self.manager.refresh()
        if DEMO_REPO in self.manager.catalog.entries:
            self.manager.coming.pop(DEMO_REPO, None)
        if self.manager.default is None and DEMO_REPO in self.manager.catalog.entries:
            self.manager.set_default(DEMO_REPO)
            self.manager.no_default_note = ""
        finished = step == state.get("steps")
        log.info("demo model: %s at step %d of %s%s", "finished" if finished else "checkpoint", step,
                 state.get("steps"), f" (loss {state['loss']})" if step and state.get("loss") is not None else "")
        self.restart_pending.setdefault(DEMO_REPO, time.monotonic())

    async def _restart_idle(self) -> None:
        """Restart each model waiting for it once nothing runs on it (or,
        busy for BUSY_WAIT_S, once its running requests finish: the
        router's drain); a request that comes meanwhile waits for the new
        process to load. Then, if the Whisper waits to be offered, offer it
        once the default model's process has it."""
        for name, since in sorted(self.restart_pending.items()):
            slot = self.manager.slots.get(name)
            if slot is None or slot.status not in ("loaded", "loading") or slot.child is None:
                self.restart_pending.pop(name)  # not loaded: its next load starts it as it should be
                continue
            busy = slot.users and time.monotonic() - since < BUSY_WAIT_S
            if busy or slot.status == "loading" or slot.unloading:
                continue  # looked at again at the next poll
            self.restart_pending.pop(name)
            started = time.monotonic()
            try:
                await self.manager.unload(name)
                await self.manager.load(name)
            except RouterError as exc:  # the next request that names it loads it
                log.warning("%s: starting it again: %s", name, exc.message)
                continue
            log.info("%s: started again in %.1fs", name, time.monotonic() - started)
        if self.handing_over and self.manager.default not in self.restart_pending:
            self.handing_over = False
            runtime.whisper_model = WHISPER_REPO
            runtime.speech_build = {**(runtime.speech_build or {}), "state": "done"}
            log.info("demo speech model %s: transcription is offered", WHISPER_REPO)

    def _chat_ended(self, code: int) -> None:
        if code == 0:
            runtime.demo_build = {**(runtime.demo_build or {}), "state": "done"}
            return
        state = runtime.demo_build or {}
        # However it ended, the model no longer comes while this server runs: a request that names it (or
        # none) is told it is not there, not that it is training, forever after (the OOM killer, say).
        if self.manager is not None:
            self.manager.no_default_note = ""
            self.manager.coming.pop(DEMO_REPO, None)
        if code == STOPPED and self.chat is not None:  # stopped as asked (a Ctrl-C reaches the build too)
            runtime.demo_build = self._stopped(self.chat, state, "demo model")
            return
        if code in KILLED:
            runtime.demo_build = self._killed(code, state, "demo model")
            return
        error = state.get("error") or f"the build exited with status {code}"
        runtime.demo_build = {**state, "state": "failed", "error": error}
        log.error("demo model: training failed (%s); `hearth make-demo-model` shows why. %s", error,
                  "The last checkpoint stays served." if self.served_step is not None else "")

    @staticmethod
    def _stopped(build: Build, state: dict, label: str) -> dict:
        """A build stopped as asked is no failure: its last state, logged with the step it saved."""
        saved = build.read()
        state = {**state, **{k: v for k, v in (saved or {}).items() if k in STATE_KEYS}}
        log.info("%s: training stopped at step %s of %s; the next start goes on from there", label,
                 state.get("step"), state.get("steps"))
        return state

    @staticmethod
    def _killed(code: int, state: dict, label: str) -> dict:
        """A build ended by a signal (`KILLED`) is no failure either: it goes on from the state it saved last."""
        log.info("%s: training ended by signal %d at step %s of %s; the next start goes on from the training "
                 "state saved last", label, -code, state.get("step"), state.get("steps"))
        return {**state, "state": "stopped"}

    def _speech_failed(self, error: str) -> None:
        runtime.speech_build = {**(runtime.speech_build or {}), "state": "failed", "error": error}
        log.error("demo speech model: training failed (%s); `hearth make-demo-model --kind audio` shows why", error)

    async def _speech_ended(self, code: int) -> None:
        if code == STOPPED and self.speech is not None:
            runtime.speech_build = self._stopped(self.speech, runtime.speech_build or {}, "demo speech model")
            return
        if code in KILLED:
            runtime.speech_build = self._killed(code, runtime.speech_build or {}, "demo speech model")
            return
        if code != 0:
            self._speech_failed((runtime.speech_build or {}).get("error") or f"the build exited with status {code}")
            return
        self.manager.share_flag("--whisper-model", WHISPER_REPO)
        loaded = [s.id for s in self.manager.slots.values() if s.child is not None]  # this router's own processes
        for name in loaded:
            self.restart_pending.setdefault(name, time.monotonic())
        runtime.speech_build = {**(runtime.speech_build or {}), "state": "handing over"}
        self.handing_over = True  # offered once the default model's process has it (`_restart_idle`)
        log.info("demo speech model %s built: %s", WHISPER_REPO,
                 f"{', '.join(loaded)} start again to take it" if loaded else "models take it as they load")
        await self._restart_idle()

    def stop(self) -> None:
        """As the server stops: the builds still running are asked to stop, and say where they did."""
        if self.task is not None:
            self.task.cancel()
        for build, label in ((self.chat, "demo model"), (self.speech, "demo speech model")):
            code = build.stop() if build is not None else None
            if build is not None and code == STOPPED:
                self._stopped(build, {}, label)
            elif code == 0:  # asked as it published its finished model: it finished that first
                log.info("%s: finished as the server stopped; the next start serves it", label)
