"""The local model library: what the Hugging Face cache (`HF_HOME`) holds.

One row per model repo, for the revision `refs/main` points at (the newest
snapshot when no ref names one): its architecture, size, quantization,
whether mlx-lm can load it, and what its config says it takes as input.
Reads configs and safetensors headers only, never tensor bytes, and never
the network.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

from hub.locks import is_locked

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
    if importlib.util.find_spec(f"mlx_lm.models.{name}") is not None:
        return "targeted"
    try:
        from mlx_lm.utils import MODEL_REMAPPING
    except ImportError:
        MODEL_REMAPPING = {}
    target = MODEL_REMAPPING.get(model_type) or {"mistral": "llama"}.get(model_type)
    if target and importlib.util.find_spec(f"mlx_lm.models.{target}") is not None:
        return "generic"
    return None


def supported_architecture(model_type: str) -> bool:
    return support_tier(model_type) is not None


def _header_params(file: Path, quant_bits: int | None) -> int:
    """Parameters in one safetensors file, from its header alone."""
    try:
        with open(file, "rb") as f:
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
        packed = name.endswith(".weight") and name[:-7] + ".scales" in names and quant_bits
        total += count * 32 // quant_bits if packed else count
    return total


def describe(repo_id: str, snapshot: Path, commit: str) -> LocalModel:
    try:
        config = json.loads((snapshot / "config.json").read_text())
        if not isinstance(config, dict):
            config = {}
    except (OSError, ValueError):
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


def scan() -> list[LocalModel]:
    """Every model repo in the cache, by repo id."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return []
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        if not any(r.refs for r in repo.revisions) and is_locked(repo.repo_path):
            continue  # its first download is still running
        main = [r for r in repo.revisions if "main" in r.refs]
        revision = main[0] if main else max(repo.revisions, key=lambda r: r.last_modified)
        if not (revision.snapshot_path / "config.json").is_file():
            continue
        found.append(describe(repo.repo_id, revision.snapshot_path, revision.commit_hash))
    return found


def servable_models() -> list[LocalModel]:
    return [m for m in scan() if m.supported]
