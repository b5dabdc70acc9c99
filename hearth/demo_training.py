"""`hearth serve --build-demo` (what `make serve` runs): the demo chat model
trained in the background while the router answers.

When the cache holds no finished demo model, the router starts `hearth
make-demo-model --checkpoints` (niced, tied to the router: it ends with it)
and watches the state that build keeps in `home.demo_build()`. At each
checkpoint the build publishes, the router takes the model into its
library, makes it the default when there is none yet, and swaps the new
weights in: a loaded demo process is restarted once no request is running
on it (the next request loads the new snapshot). The first checkpoint
is the untrained model, seconds after the start (it answers, in babble);
what is served only gets better from then on, and the last is the
finished model, the same one a plain build makes.

The progress is on `/health` and `/stats` (`demo_build`), the dashboard's
Status and Models pages, and the log.
"""
from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from huggingface_hub import constants

from core import home, procs
from hearth.root import RUNTIME as runtime
from serving.demo.build import DEMO_REPO, Recipe, cached_snapshot, published_step
from serving.router.manager import Manager
from serving.router.slots import RouterError

log = logging.getLogger("hearth.serve")
POLL_S = 1.0


def demo_is_built() -> bool:
    """The finished demo chat model is in the HF cache."""
    return cached_snapshot(Path(constants.HF_HUB_CACHE), Recipe()) is not None


def demo_checkpoint_step() -> int | None:
    """How far the published demo chat model was trained (None: none published)."""
    return published_step(Path(constants.HF_HUB_CACHE), Recipe())


class DemoTraining:
    """The background build and what the router does with its checkpoints."""

    def __init__(self, manager: Manager):
        self.manager = manager
        self.proc: subprocess.Popen | None = None
        self.served_step: int | None = None  # the checkpoint the router has taken in
        self.swap_pending = False
        self.task: asyncio.Task | None = None
        self._progress = home.demo_build()

    def start(self) -> None:
        """Start the build (from the main thread, which lives as long as the
        server: see `core.procs.spawn`). Call before the server listens."""
        self._progress.unlink(missing_ok=True)
        nice = shutil.which("nice")  # the server's requests come first
        self.proc = procs.spawn([*([nice, "-n", "10"] if nice else []), sys.executable, "-m", "hearth.cli",
                                 "make-demo-model", "--checkpoints"], stdin=subprocess.DEVNULL)
        self.served_step = demo_checkpoint_step()  # a build cut short before left one
        runtime.demo_build = {"state": "starting", "step": 0, "steps": Recipe().steps, "served_step": self.served_step,
                              "model": DEMO_REPO, "pid": self.proc.pid}
        if self.manager.default is None:
            self.manager.no_default_note = (f"the demo model {DEMO_REPO} is training and is served from its first "
                                            "checkpoint, seconds after the start (GET /health shows the progress)")
        log.info("training the demo model %s in the background (pid %d): served from its first checkpoint, "
                 "seconds from now, and swapped for each better one as it trains (about 10 minutes in all)",
                 DEMO_REPO, self.proc.pid)

    def watch(self) -> None:
        """On the server's loop: follow the build until it ends."""
        self.task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        proc = self.proc
        assert proc is not None
        while True:
            await asyncio.sleep(POLL_S)
            code = proc.poll()
            await self._look()
            if code is not None:
                self._ended(code)
                return

    def _read(self) -> dict | None:
        try:
            state = json.loads(self._progress.read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    async def _look(self) -> None:
        state = self._read()
        if state is not None:
            runtime.demo_build = {**(runtime.demo_build or {}), **{k: state.get(k) for k in (
                "state", "step", "steps", "loss", "seconds", "error")}}
            step = state.get("served_step")
            if isinstance(step, int) and step != self.served_step:
                await self._take(step, state)
        if self.swap_pending:
            await self._swap()

    async def _take(self, step: int, state: dict) -> None:
        """A new checkpoint is published: into the library, the default if
        there is none, and swapped in where it is loaded."""
        self.served_step = step
        runtime.demo_build = {**(runtime.demo_build or {}), "served_step": step}
        await self.manager.refresh()
        if self.manager.default is None and DEMO_REPO in self.manager.catalog.entries:
            self.manager.set_default(DEMO_REPO)
            self.manager.no_default_note = ""
        finished = step == state.get("steps")
        log.info("demo model: %s at step %d of %s%s", "finished" if finished else "checkpoint", step,
                 state.get("steps"), f" (loss {state['loss']})" if step and state.get("loss") is not None else "")
        self.swap_pending = True

    async def _swap(self) -> None:
        """Restart the demo's process once nothing runs on it; a request
        that comes meanwhile waits for the new weights to load."""
        slot = self.manager.slots.get(DEMO_REPO)
        if slot is None or slot.status not in ("loaded", "loading") or slot.child is None:
            self.swap_pending = False  # not loaded: the next load reads the new snapshot
            return
        if slot.users or slot.status == "loading" or slot.unloading:
            return  # looked at again at the next poll
        self.swap_pending = False
        started = time.monotonic()
        try:
            await self.manager.unload(DEMO_REPO)
            await self.manager.load(DEMO_REPO)
        except RouterError as exc:  # the next request that names it loads it
            log.warning("demo model: loading the new weights: %s", exc.message)
            return
        log.info("demo model: new weights loaded in %.1fs", time.monotonic() - started)

    def _ended(self, code: int) -> None:
        if code == 0:
            runtime.demo_build = {**(runtime.demo_build or {}), "state": "done"}
            return
        state = runtime.demo_build or {}
        error = state.get("error") or f"the build exited with status {code}"
        runtime.demo_build = {**state, "state": "failed", "error": error}
        self.manager.no_default_note = ""
        log.error("demo model: training failed (%s); `hearth make-demo-model` shows why. %s", error,
                  "The last checkpoint stays served." if self.served_step is not None else "")

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
