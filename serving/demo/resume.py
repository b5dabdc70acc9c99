"""What a demo chat build cut short leaves for the next build of the same
recipe to go on from: one safetensors file holding the model's weights
(`model.*`) and the optimizer's state tree (`optimizer.*`: AdamW's moments
and its step count, which is where the learning-rate schedule stands),
with, in its metadata, the step, the loss then, and what the build was
(`identity`: builder version, recipe, and a digest of the tokenizer and
the batches, so a changed corpus starts over as a changed recipe does).

The rest of what makes the remaining steps those of an uninterrupted build
is not saved: the data order is a `random.Random(seed)` the build draws
from once a step, so it is drawn again up to the step saved; the steps
draw no MLX random numbers, and MLX's generator is seeded from the recipe
before the model is made on every build.

mlx-lm's tuner saves adapter weights alone (its `--resume-adapter-file`
starts the optimizer and its schedule over), so the optimizer's tree is
saved here with MLX's own `tree_flatten` and `mx.save_safetensors`.

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.fs import write_atomically

log = logging.getLogger("hearth.demo")
META_KEY = "hearth_demo_resume"


@dataclass(frozen=True)
class Resumed:
    step: int  # the steps trained, also the optimizer's step count
    loss: float | None  # the loss at that step


def identity(builder_version: int, recipe: dict, tokenizer_json: str, batches: list) -> dict:
    """What a saved state must have been trained on to be continued: the
    builder, the recipe, and a digest of the tokenizer and the batches (a
    third of a second for the full recipe's)."""
    digest = hashlib.sha256(tokenizer_json.encode())
    digest.update(json.dumps(batches, separators=(",", ":")).encode())
    return {"builder_version": builder_version, "recipe": recipe, "data": digest.hexdigest()}


def save(path: Path, ident: dict, step: int, loss: float | None, model, optimizer) -> float:
    """Write the state after `step` (the optimizer's own count must agree);
    returns the seconds it took."""
    import mlx.core as mx

    started = time.monotonic()
    if int(optimizer.state["step"].item()) != step:
        raise ValueError(f"the optimizer has taken {optimizer.state['step'].item()} steps, not {step}")
    arrays = {f"model.{k}": v for k, v in _flat(model.parameters()).items()}
    arrays.update({f"optimizer.{k}": v for k, v in _flat(optimizer.state).items()})
    meta = {"identity": ident, "step": step, "loss": None if loss is None else round(float(loss), 6)}
    buffer = io.BytesIO()
    mx.save_safetensors(buffer, arrays, metadata={META_KEY: json.dumps(meta)})
    write_atomically(path, buffer.getvalue())
    return time.monotonic() - started


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


def restore(path: Path, ident: dict, model, optimizer) -> Resumed | None:
    """Put the state saved at `path` into `model` and `optimizer` (made as
    a fresh build makes them, the optimizer not stepped yet) and say where
    it stands; None when there is none to go on from: the model is then
    untouched, and the optimizer at most initialised (zero moments, step 0:
    what its first step would make of it)."""
    if not path.exists():
        return None
    try:
        found = _read(path, ident, model, optimizer)
    except Exception as exc:  # noqa: BLE001 - whatever is wrong with it, the build starts over
        log.warning("demo build: the saved training state %s is unreadable (%s); starting at step 0", path, exc)
        clear(path)
        return None
    if found is None:
        log.info("demo build: the saved training state %s is another recipe's or corpus's; deleted, "
                 "starting at step 0", path)
        clear(path)
        return None
    resumed, model_weights, optimizer_state = found
    model.load_weights(model_weights)
    optimizer.state.update(optimizer_state)
    return resumed


def _read(path: Path, ident: dict, model, optimizer) -> tuple[Resumed, list, dict] | None:
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
    step, loss = meta.get("step"), meta.get("loss")
    if not isinstance(step, int) or step < 1 or not (loss is None or isinstance(loss, (int, float))):
        raise ValueError(f"a step of {step!r}, a loss of {loss!r}")
    optimizer.init(model.trainable_parameters())  # the tree a build's first step would make: what to expect
    _expect(arrays, "model.", _flat(model.parameters()))
    _expect(arrays, "optimizer.", _flat(optimizer.state))
    if int(arrays["optimizer.step"].item()) != step:
        raise ValueError(f"the optimizer's step {arrays['optimizer.step'].item()} is not the step saved, {step}")
    model_weights = [(k[len("model."):], v) for k, v in arrays.items() if k.startswith("model.")]
    # Into the tree `init` made, leaf by leaf: it also holds the empty containers (a model's list
    # of no parameters) that tree_flatten leaves out and the optimizer's update walks.
    optimizer_state = tree_map_with_path(lambda key, _: arrays["optimizer." + key], optimizer.state)
    return Resumed(step, None if loss is None else float(loss)), model_weights, optimizer_state


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
