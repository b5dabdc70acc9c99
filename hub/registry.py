"""The local model library: what the Hugging Face cache (`HF_HOME`) holds.

One row per model repo, for the revision `refs/main` points at (the newest
snapshot when no ref names one): its architecture, size, quantization,
whether mlx-lm can load it, and what its config says it takes as input.
Reads configs and safetensors headers only, never tensor bytes, and never
the network. The cache is the user's: every file is checked to be a regular
file before it is opened (a FIFO would block the scan, and every request
after it, forever), which is why refs are read here rather than by
huggingface_hub's scan_cache_dir.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from core.paths import open_regular, read_json, read_text
from hub.locks import is_locked
from inference.engine.vision import SUPPORTED as VISION_TYPES  # served through mlx-vlm

log = logging.getLogger("hearth.hub")

SAFETENSORS_BITS = {"F64": 64, "F32": 32, "F16": 16, "BF16": 16, "I64": 64, "I32": 32, "U32": 32, "I16": 16,
                    "U16": 16, "I8": 8, "U8": 8, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8}


@dataclass(frozen=True)
class LocalModel:
    repo_id: str
    path: Path  # the snapshot directory
    commit: str
    model_type: str | None
    size_bytes: int  # the files of this revision
    weights_bytes: int  # its safetensors files
    params: int  # parameters, counting quantized weights unpacked
    quant_bits: int | None
    quant_group_size: int | None
    supported: bool
    support_tier: str | None  # "targeted": mlx-lm has the architecture; "generic": through a remapping
    vision: bool
    audio: bool
    config: dict

    def row(self) -> dict:
        return {"repo_id": self.repo_id, "model_type": self.model_type, "size_bytes": self.size_bytes,
                "quant_bits": self.quant_bits, "quant_group_size": self.quant_group_size, "vision": self.vision,
                "audio": self.audio, "supported": self.supported, "support_tier": self.support_tier}


def support_tier(model_type: str | None) -> str | None:
    if not model_type:
        return None
    name = model_type.replace("-", "_")
    if importlib.util.find_spec(f"mlx_lm.models.{name}") is not None or name in VISION_TYPES:
        return "targeted"
    try:
        from mlx_lm.utils import MODEL_REMAPPING
    except ImportError:
        MODEL_REMAPPING = {}
    target = MODEL_REMAPPING.get(model_type) or {"mistral": "llama"}.get(model_type)
    if target and importlib.util.find_spec(f"mlx_lm.models.{target}") is not None:
        return "generic"
    return None


def _header_params(file: Path, quant_bits: int | None) -> int:
    """Parameters in one safetensors file, from its header alone."""
    try:
        with open_regular(file, "weights") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 << 20:
                return 0
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return 0
    names = set(header)
    total = 0
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        count = 1
        for dim in info.get("shape", []):
            count *= dim
        if name.endswith((".scales", ".biases")) and name.rsplit(".", 1)[0] + ".weight" in names:
            continue  # quantization metadata, not parameters
        packed = name.endswith(".weight") and name[:-7] + ".scales" in names
        total += count * 32 // quant_bits if packed and quant_bits else count
    return total


def describe(repo_id: str, snapshot: Path, commit: str) -> LocalModel:
    try:
        config = read_json(snapshot / "config.json", "config.json")
        if not isinstance(config, dict):
            config = {}
    except (OSError, ValueError):  # missing, not JSON, or not a regular file (PathRefused)
        config = {}
    files = [p for p in snapshot.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    quant = config.get("quantization") or config.get("quantization_config") or {}
    bits = quant.get("bits") if isinstance(quant, dict) else None
    group = quant.get("group_size") if isinstance(quant, dict) else None
    weights = [p for p in files if p.suffix == ".safetensors"]
    model_type = config.get("model_type") or None
    tier = support_tier(model_type)
    return LocalModel(
        repo_id=repo_id, path=snapshot, commit=commit, model_type=model_type, size_bytes=size,
        weights_bytes=sum(p.stat().st_size for p in weights),
        params=sum(_header_params(p, bits) for p in weights), quant_bits=bits, quant_group_size=group,
        supported=tier is not None, support_tier=tier, vision=bool(config.get("vision_config")),
        audio=bool(config.get("audio_config")), config=config)


def _refs(repo_dir: Path) -> dict[str, set[str]]:
    """Commit -> the names of the refs that point at it. A ref that is not
    a regular file is passed over, never opened."""
    out: dict[str, set[str]] = {}
    refs = repo_dir / "refs"
    if not refs.is_dir():
        return out
    for ref in sorted(refs.rglob("*")):
        if ref.is_dir():
            continue
        try:
            commit = read_text(ref, "ref", 4096).strip()
        except (OSError, ValueError):
            continue
        out.setdefault(commit, set()).add(ref.relative_to(refs).as_posix())
    return out


def _last_modified(snapshot: Path) -> float:
    """When a revision last changed: its newest file (links followed to the blobs)."""
    times = []
    for file in snapshot.rglob("*"):
        try:
            times.append(os.stat(file).st_mtime)
        except OSError:
            pass
    try:
        return max(times) if times else snapshot.stat().st_mtime
    except OSError:
        return 0.0


def _revision(repo_dir: Path) -> Path | None:
    """The snapshot `refs/main` names, else the newest one; None while the
    repo's first download is still running or when it has no snapshot."""
    try:
        snapshots = [p for p in (repo_dir / "snapshots").iterdir() if p.is_dir()]
    except OSError:
        return None
    if not snapshots:
        return None
    refs = _refs(repo_dir)
    main = [p for p in snapshots if "main" in refs.get(p.name, ())]
    if main:
        return main[0]
    if not any(p.name in refs for p in snapshots) and is_locked(repo_dir):
        return None  # its first download is still running
    return max(snapshots, key=_last_modified)


def snapshot(repo_id: str) -> Path | None:
    """The snapshot folder `repo_id` is served from here (as `scan` picks it), or None."""
    from huggingface_hub import constants

    return _revision(Path(constants.HF_HUB_CACHE).expanduser() / f"models--{repo_id.replace('/', '--')}")


def scan() -> list[LocalModel]:
    """Every model repo in the cache, by repo id."""
    from huggingface_hub import constants

    try:
        repo_dirs = [d for d in Path(constants.HF_HUB_CACHE).expanduser().resolve().glob("models--*") if d.is_dir()]
    except OSError:
        return []
    found = []
    for repo_dir in repo_dirs:
        repo_id = repo_dir.name.removeprefix("models--").replace("--", "/")
        snapshot = _revision(repo_dir)
        if snapshot is None or not (snapshot / "config.json").is_file():
            continue
        found.append(describe(repo_id, snapshot, snapshot.name))
    return sorted(found, key=lambda m: m.repo_id)


def is_whisper(config: dict) -> bool:
    """An mlx-whisper checkpoint: its config holds the model's dimensions
    (`n_mels`, ...). Transformers' Whisper (`num_mel_bins`) is not one."""
    return config.get("model_type") == "whisper" and "n_mels" in config


def whisper_checkpoints() -> list[str]:
    """The repo ids of the cache's mlx-whisper checkpoints, sorted, from
    their config.json alone (a start reads no weights)."""
    from huggingface_hub import constants

    try:
        repo_dirs = sorted(d for d in Path(constants.HF_HUB_CACHE).expanduser().resolve().glob("models--*")
                           if d.is_dir())
    except OSError:
        return []
    found = []
    for repo_dir in repo_dirs:
        snapshot = _revision(repo_dir)
        try:
            config = read_json(snapshot / "config.json", "config.json") if snapshot is not None else None
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and is_whisper(config):
            found.append(repo_dir.name.removeprefix("models--").replace("--", "/"))
    return found


def servable_models() -> list[LocalModel]:
    return [m for m in scan() if m.supported]
