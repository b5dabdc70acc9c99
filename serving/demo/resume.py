"""What a demo build cut short (the chat model's, the speech model's)
leaves for the next build of the same recipe to go on from: one
safetensors file holding the trained weights (`model.*`) and the
optimizer's state tree (`optimizer.*`: AdamW's moments and its step count,
which is where the learning-rate schedule stands), with, in its metadata,
the step, the loss then, what the build was (`identity`: builder version,
recipe, and a digest of the data it trains on, so a changed corpus starts
over as a changed recipe does), and `extra`: what else the build needs to
take the steps left as an uninterrupted build takes them, as JSON.

What that is depends on the build. The chat build's data order is a
`random.Random(seed)` drawn from once a step, so it is drawn again up to
the step saved (nothing in `extra`). The speech build draws its clips from
a `random.Random` and a numpy `Generator` and makes their log-mel
spectrograms every step, too slow to draw again, so it saves their states
there (`generator_states`, `generators`). Neither build's steps draw MLX
random numbers, and MLX's generator is seeded from the recipe before the
weights are made on every build.

mlx-lm's tuner saves adapter weights alone (its `--resume-adapter-file`
starts the optimizer and its schedule over), so the optimizer's tree is
saved here with MLX's own `tree_flatten` and `mx.save_safetensors`.

A build asked to stop (Ctrl-C, SIGTERM) finishes the step under way and
saves it (`StopAsked`, `save_or_warn`). Asked from its last step on, it
finishes instead: it writes, publishes and tidies its model with the
handler still on (a second or two), then ends as a finished build, since a
build cut off there leaves the model half-published; only a stretch the
build can do without, and that takes long (the speech build's held-out
measuring), ends at once (`StopAsked.at_once`). What a finished build
leaves is one thing for both builds (`finished`), made sure of again by a
start that finds the finished model, for a build killed in between.

Rules: the file is written whole or not at all (`core.fs.write_atomically`);
one that cannot be read, or that another recipe or corpus left, is deleted
and the build starts at step 0, with a log line that says why; MLX is
imported lazily and nothing here knows of Django (the build process
imports it)."""
from __future__ import annotations

import hashlib
import io
import json
import logging
import random
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from core.fs import write_atomically

log = logging.getLogger("hearth.demo")
META_KEY = "hearth_demo_resume"


@dataclass(frozen=True)
class Resumed:
    step: int  # the steps trained, also the optimizer's step count
    loss: float | None  # the loss at that step
    weights: dict[str, Any] = field(repr=False)  # the trained arrays, by their `tree_flatten` key
    extra: Any = field(repr=False)  # what the build saved beside them, as `restore`'s `read_extra` read it


def identity(builder_version: int, recipe: dict, data: Iterable[bytes | str]) -> dict:
    """What a saved state must have been trained on to be continued: the
    builder, the recipe, and a digest of the data (for the chat build its
    tokenizer and batches, a third of a second for the full recipe's)."""
    digest = hashlib.sha256()
    for part in data:
        digest.update(part.encode() if isinstance(part, str) else part)
    return {"builder_version": builder_version, "recipe": recipe, "data": digest.hexdigest()}


def generator_states(rng: random.Random, noise: np.random.Generator) -> dict:
    """The states of a build's random generators, as JSON takes them."""
    return {"random": rng.getstate(), "numpy": noise.bit_generator.state}


def generators(states: dict) -> tuple[random.Random, np.random.Generator]:
    """New generators where `generator_states` found them (JSON made the
    tuples lists); a state that is not one raises (`restore`'s `read_extra`)."""
    version, internal, gauss = states["random"]
    rng = random.Random()
    rng.setstate((version, tuple(internal), gauss))
    noise = np.random.default_rng()
    noise.bit_generator.state = states["numpy"]
    return rng, noise


def save(path: Path, ident: dict, step: int, loss: float | None, params, optimizer, extra: dict | None = None
         ) -> float:
    """Write the state after `step` (the optimizer's own count must agree):
    `params`, the tree of trained arrays (a model's `parameters()`, a dict),
    the optimizer's tree, and `extra`; returns the seconds it took."""
    import mlx.core as mx

    started = time.monotonic()
    if int(optimizer.state["step"].item()) != step:
        raise ValueError(f"the optimizer has taken {optimizer.state['step'].item()} steps, not {step}")
    arrays = {f"model.{k}": v for k, v in _flat(params).items()}
    arrays.update({f"optimizer.{k}": v for k, v in _flat(optimizer.state).items()})
    meta = {"identity": ident, "step": step, "loss": None if loss is None else round(float(loss), 6),
            "extra": extra or {}}
    buffer = io.BytesIO()
    mx.save_safetensors(buffer, arrays, metadata={META_KEY: json.dumps(meta)})
    write_atomically(path, buffer.getvalue())
    return time.monotonic() - started


def save_or_warn(path: Path, ident: dict, step: int, loss: float, params, optimizer, extra: dict | None = None
                 ) -> None:
    """`save`, logged; a failure costs a resume, never the build."""
    try:
        seconds = save(path, ident, step, loss, params, optimizer, extra)
    except Exception as exc:  # noqa: BLE001 - a full disk, a state caught between steps
        log.warning("demo build: could not save the training state at step %d in %s: %s", step, path, exc)
        return
    log.info("demo build: training state at step %d saved in %.2fs (%s)", step, seconds, path)


def saved_step(path: Path) -> int | None:
    """The step the state at `path` was saved at, read from the file's
    header alone (no MLX, no arrays; whose recipe it is not checked: what a
    server says as it starts a build); None when there is none to read."""
    try:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")  # safetensors: the header's length, then the header
            if not 0 < size <= 1 << 20:
                return None
            meta = json.loads(json.loads(f.read(size))["__metadata__"][META_KEY])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    step = meta.get("step") if isinstance(meta, dict) else None
    return step if isinstance(step, int) and step > 0 else None


def clear(path: Path) -> None:
    path.unlink(missing_ok=True)


def finished(resume_path: Path | None, leftovers: Callable[[], None] | None = None) -> None:
    """What a build leaves once its finished model is published: no
    training state to go on from, and, with `leftovers`, nothing else it
    made on the way (the chat build's checkpoints). Run again by a start
    that finds the finished model: a build killed between its publishing
    and this left them, and they would be taken for an unfinished build's."""
    if leftovers is not None:
        leftovers()
    if resume_path is not None:
        clear(resume_path)


def restore(path: Path, ident: dict, params, optimizer, read_extra: Callable[[dict], Any] = dict
            ) -> Resumed | None:
    """The state saved at `path`, for a build that made `params` (every
    array of them trained) and `optimizer` as a fresh build makes them (the
    optimizer not stepped yet): the optimizer's state is put back, the
    weights returned for the build to load, with `read_extra(extra)` (which
    raises for a damaged one), and where it stands said; None when there is
    none to go on from, the optimizer then at most initialised (zero
    moments, step 0: what its first step would make of it)."""
    if not path.exists():
        return None
    try:
        found = _read(path, ident, params, optimizer, read_extra)
    except Exception as exc:  # noqa: BLE001 - whatever is wrong with it, the build starts over
        log.warning("demo build: the saved training state %s is unreadable (%s); starting at step 0", path, exc)
        clear(path)
        return None
    if found is None:
        log.info("demo build: the saved training state %s is another recipe's or corpus's; deleted, "
                 "starting at step 0", path)
        clear(path)
        return None
    resumed, optimizer_state = found
    optimizer.state.update(optimizer_state)
    return resumed


def _read(path: Path, ident: dict, params, optimizer, read_extra: Callable[[dict], Any]
          ) -> tuple[Resumed, dict] | None:
    """The saved state, checked against what this build made, before any of
    it is applied: None for another recipe's; ValueError for a damaged one."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path

    loaded: Any = mx.load(str(path), format="safetensors", return_metadata=True)
    arrays: dict[str, Any] = loaded[0]
    metadata: dict[str, str] = loaded[1]
    meta = json.loads(metadata[META_KEY])
    if meta.get("identity") != ident:
        return None
    step, loss, extra = meta.get("step"), meta.get("loss"), meta.get("extra", {})
    if not isinstance(step, int) or step < 1 or not (loss is None or isinstance(loss, (int, float))) \
            or not isinstance(extra, dict):
        raise ValueError(f"a step of {step!r}, a loss of {loss!r}")
    optimizer.init(params)  # the tree a build's first step would make: what to expect
    _expect(arrays, "model.", _flat(params))
    _expect(arrays, "optimizer.", _flat(optimizer.state))
    if int(arrays["optimizer.step"].item()) != step:
        raise ValueError(f"the optimizer's step {arrays['optimizer.step'].item()} is not the step saved, {step}")
    weights = {k[len("model."):]: v for k, v in arrays.items() if k.startswith("model.")}
    # Into the tree `init` made, leaf by leaf: it also holds the empty containers (a model's list
    # of no parameters) that tree_flatten leaves out and the optimizer's update walks.
    optimizer_state = tree_map_with_path(lambda key, _: arrays["optimizer." + key], optimizer.state)
    return Resumed(step, None if loss is None else float(loss), weights, read_extra(extra)), optimizer_state


def _flat(tree) -> dict[str, Any]:
    from mlx.utils import tree_flatten

    flat: dict[str, Any] = {}
    tree_flatten(tree, destination=flat)
    return flat


def _expect(arrays: dict[str, Any], prefix: str, want: dict[str, Any]) -> None:
    got = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    if set(got) != set(want):
        raise ValueError(f"its {prefix[:-1]} holds other arrays than this build's")
    for key, array in want.items():
        if got[key].shape != array.shape or got[key].dtype != array.dtype:
            raise ValueError(f"{prefix}{key} is {got[key].shape} {got[key].dtype}, not {array.shape} {array.dtype}")


class StopAsked:
    """Ctrl-C (SIGINT) or SIGTERM (a server stopping its background build)
    in a build's training loop, when `graceful`: the step under way finishes
    and its state is saved before the KeyboardInterrupt (`stop_here`), since
    one raised amid a step (most often in `mx.eval`) leaves the weights and
    the optimizer a step apart from the last one counted. A second Ctrl-C
    acts at once (a second SIGTERM does not: `_asked`). A signal is left as
    it is where its handler is not Python's default (ignored, another
    handler) or outside the main thread."""

    DEFAULTS: dict[signal.Signals, Any] = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}

    def __init__(self, graceful: bool):
        self.graceful, self.asked = graceful, False
        self.installed: list[signal.Signals] = []

    def __enter__(self) -> StopAsked:
        if self.graceful and threading.current_thread() is threading.main_thread():
            for signum, default in self.DEFAULTS.items():
                if signal.getsignal(signum) is default:
                    signal.signal(signum, self._asked)
                    self.installed.append(signum)
        return self

    def stop_here(self, step: int, steps: int) -> bool:
        """Whether the build stops after `step`: asked to, before its last
        step (asked during the last one, it finishes instead)."""
        return self.asked and step < steps

    @contextmanager
    def at_once(self) -> Iterator[None]:
        """A stretch of the build's ending that a stop ends at once
        (KeyboardInterrupt), one asked before it included: long work the
        build can do without (the speech build's held-out measuring, minutes
        on two cores), once its last step is saved, so the next build trains
        nothing again. Outside it, the handler is the one in force before."""
        if not self.installed:
            yield
            return
        if self.asked:
            raise KeyboardInterrupt

        def now(signum, frame) -> None:
            self.asked = True
            raise KeyboardInterrupt

        for signum in self.installed:
            signal.signal(signum, now)
        try:
            yield
        finally:
            for signum in self.installed:
                signal.signal(signum, self._asked)

    def _asked(self, signum, frame) -> None:
        """A second Ctrl-C acts at once; a SIGTERM after the first signal is the
        same request (a terminal's Ctrl-C reaches the build, then its server
        stops it): the step still finishes and is saved."""
        self.asked = True
        if signal.SIGINT in self.installed:
            signal.signal(signal.SIGINT, self.DEFAULTS[signal.SIGINT])

    def __exit__(self, *exc) -> None:
        for signum in self.installed:
            signal.signal(signum, self.DEFAULTS[signum])
        self.installed = []
