"""Quantize a model with mlx-lm's converter into a repo of its own in the
local HF cache (blobs, snapshot, refs/main), so the library lists it."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from jobs.events import EventLog

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)


def output_repo(model_id: str, path: Path, bits: int) -> str:
    org, _, name = model_id.rpartition("/") if "/" in model_id and not model_id.startswith((".", "/", "~")) \
        else ("local", "", path.name)
    return f"{org or 'local'}/{name}-hearth-{bits}bit"


def check(config: dict) -> tuple[int, int]:
    """(bits, group_size), or ValueError naming the field."""
    bits, group = config.get("bits", 4), config.get("group_size", 64)
    if config.get("target_bpw") is not None:
        raise ValueError("target_bpw: mixed precision by bits-per-weight target is not offered; choose bits")
    if bits not in BITS:
        raise ValueError(f"bits must be one of {', '.join(map(str, BITS))}")
    if group not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {', '.join(map(str, GROUP_SIZES))}")
    return bits, group


def run(config: dict, log: EventLog, stage_delay: float = 0.0) -> tuple[str, dict]:
    import time

    from huggingface_hub import constants
    from mlx_lm import convert

    from inference.demo.files import publish_to_cache
    from inference.engine.loader import resolve

    def stage(name: str, progress: float, message: str) -> None:
        log.emit("stage", stage=name, progress=progress, message=message)
        if stage_delay:
            time.sleep(stage_delay)

    bits, group = check(config)
    model_id = config["model_id"]
    stage("resolve", 0.05, f"finding {model_id}")
    _, src = resolve(model_id)
    repo = output_repo(model_id, src, bits)
    config_in = json.loads((src / "config.json").read_text())
    if config_in.get("quantization"):
        raise ValueError(f"{model_id} is already quantized ({config_in['quantization']})")
    with tempfile.TemporaryDirectory(prefix="hearth-quantize-") as work:
        out = Path(work) / "model"
        stage("quantize", 0.2, f"quantizing to {bits} bits, group size {group}")
        convert(str(src), mlx_path=str(out), quantize=True, q_bits=bits, q_group_size=group)
        log.emit("log", line=f"converted {src} -> {out}")
        stage("publish", 0.9, f"publishing {repo} into the local cache")
        snapshot = publish_to_cache(out, repo, Path(constants.HF_HUB_CACHE))
    size = sum(p.stat().st_size for p in snapshot.iterdir())
    return str(snapshot), {"repo_id": repo, "bits": bits, "group_size": group, "size_bytes": size,
                           "source": str(src)}
