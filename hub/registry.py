"""What the local Hugging Face cache holds that this server could load.

A repo counts when its newest snapshot has a config.json whose
`model_type` mlx-lm implements. Reads the cache only; never the network.
"""
from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("hearth.hub")


@dataclass(frozen=True)
class CachedModel:
    repo_id: str
    path: Path
    model_type: str
    size_on_disk: int


def supported_architecture(model_type: str) -> bool:
    name = {"mistral": "llama"}.get(model_type, model_type).replace("-", "_")
    return importlib.util.find_spec(f"mlx_lm.models.{name}") is not None


def servable_models() -> list[CachedModel]:
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return []
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        newest = max(repo.revisions, key=lambda r: r.last_modified)
        try:
            model_type = json.loads((newest.snapshot_path / "config.json").read_text()).get("model_type", "")
        except (OSError, ValueError):
            continue
        if model_type and supported_architecture(model_type):
            found.append(CachedModel(repo.repo_id, newest.snapshot_path, model_type, repo.size_on_disk))
    return found
