"""What a fine-tune that did not finish leaves in its adapter folder.

While a fine-tune trains, its folder holds TRAINING_MARKER (with the
child's pid), adapter_config.json and, every `save_every` steps, the
weights: `adapters.safetensors` and a numbered copy
(`0000100_adapters.safetensors`), in that order. When the job ends any
other way than done (failed, cancelled, or found a zombie once its worker
died), the worker settles the folder here:

- the newest checkpoint that is whole and holds numbers only becomes
  `adapters.safetensors`, and `adapter_config.json` says `partial` (the
  step it holds, of how many, and how the job ended): the adapter is
  listed and mountable, marked partial;
- with no such checkpoint, the files the job wrote go, and the folder with
  them when nothing else is in it.

Files older than the job (a folder trained into before) are never touched;
the config of an adapter trained there before, which the job replaced as it
began, was kept aside (`CONFIG_BEFORE`) and is put back when the job leaves
nothing."""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path

from core.fs import write_atomically
from core.paths import CONFIG_BEFORE, TRAINING_MARKER, read_json
from jobs.adapters import adapter_config, register

WEIGHTS = "adapters.safetensors"
NUMBERED = re.compile(r"^(\d{7})_adapters\.safetensors$")
HEADER_LIMIT = 100 << 20  # safetensors' own cap on a header


def settle(job) -> None:
    """Settle the adapter folder of `job` (a fine-tune that ended, not done); nothing when the folder
    holds no marker of this job's child."""
    try:
        folder = Path(json.loads(job.config_json)["adapter_path"]).expanduser()
        marker = read_json(folder / TRAINING_MARKER, "marker")
    except (OSError, ValueError, KeyError, TypeError):  # never started training, or another job's folder
        return
    if not isinstance(marker, dict) or job.child_pid is None or marker.get("pid") != job.child_pid:
        return
    since = float(marker.get("started_at") or 0)
    mine = [p for p in folder.iterdir() if p.is_file() and not p.is_symlink() and p.stat().st_mtime >= since - 1]
    numbered = sorted((p for p in mine if NUMBERED.match(p.name)), key=lambda p: p.name, reverse=True)
    step, kept = _newest_whole(folder / WEIGHTS, numbered, mine)
    before = folder / CONFIG_BEFORE
    if kept is None:
        for path in mine:
            if path.name in (WEIGHTS, "adapter_config.json", TRAINING_MARKER) or NUMBERED.match(path.name):
                path.unlink(missing_ok=True)
        if before.is_file():  # the adapter trained here before, whole again: its weights were never replaced
            os.replace(before, folder / "adapter_config.json")
        try:
            folder.rmdir()  # only when nothing else is in it
        except OSError:
            pass
        return
    if kept.name != WEIGHTS:
        shutil.copyfile(kept, folder / (WEIGHTS + ".tmp"))
        os.replace(folder / (WEIGHTS + ".tmp"), folder / WEIGHTS)
    config = adapter_config(folder)
    config["partial"] = {"step": step, "iters": config.get("iters"), "ended": job.status, "job_id": job.id}
    write_atomically(folder / "adapter_config.json", json.dumps(config, indent=2))
    before.unlink(missing_ok=True)
    (folder / TRAINING_MARKER).unlink(missing_ok=True)
    register(folder, job=job)


def _newest_whole(weights: Path, numbered: list[Path], mine: list[Path]) -> tuple[int | None, Path | None]:
    """(the step, the file) of the newest checkpoint that is whole and finite. `adapters.safetensors` is
    written before the numbered copy of a step: when it is no newer than the newest numbered file it holds
    that step; newer, it is a step whose numbered copy never came (the job ended between the two writes),
    whose number is not known, so the newest numbered file is taken instead (when there is none, the
    weights are kept without a step)."""
    newest = int(NUMBERED.match(numbered[0].name).group(1)) if numbered else None  # type: ignore[union-attr]
    if weights in mine and _whole_and_finite(weights) and (
            not numbered or weights.stat().st_mtime_ns <= numbered[0].stat().st_mtime_ns):
        return newest, weights
    for path in numbered:
        if _whole_and_finite(path):
            return int(NUMBERED.match(path.name).group(1)), path  # type: ignore[union-attr]
    return None, None


def _whole_and_finite(path: Path) -> bool:
    """Whether a safetensors file is whole (its header's offsets end where the file does) and every
    float in it is a number. Read here by hand: the worker runs no MLX, and safetensors' numpy loader
    refuses bf16, which is what adapters of bf16 models hold."""
    import numpy as np

    try:
        data = path.read_bytes()
        (size,) = struct.unpack("<Q", data[:8])
        if size > HEADER_LIMIT:
            return False
        header = json.loads(data[8:8 + size])
        body = memoryview(data)[8 + size:]
        tensors = [v for k, v in header.items() if k != "__metadata__"]
        if not tensors or max(v["data_offsets"][1] for v in tensors) != len(body):
            return False
        for tensor in tensors:
            start, end = tensor["data_offsets"]
            raw = body[start:end]
            if tensor["dtype"] in ("F32", "F16"):
                if not np.isfinite(np.frombuffer(raw, np.float32 if tensor["dtype"] == "F32" else np.float16)).all():
                    return False
            elif tensor["dtype"] == "BF16" and (np.frombuffer(raw, np.uint16) & 0x7F80 == 0x7F80).any():
                return False  # all exponent bits set: an infinity or a NaN
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return False
    return True
