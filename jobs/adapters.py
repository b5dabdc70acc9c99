"""Adapters on disk and in the database: registering one, and finding every
adapter a user could mount (under HEARTH_HOME/adapters, plus any folder a
row remembers)."""
from __future__ import annotations

import re
from pathlib import Path

from django.utils import timezone

from core import home
from core.paths import REPO_ID, TRAINING_MARKER, read_json
from jobs.models import Adapter


def bare_name(ref) -> str | None:
    """A model reference reduced to its bare repo name, lower-cased:
    "org/name", a hub cache path (models--org--name/...) or a folder."""
    if not ref:
        return None
    text = str(ref).rstrip("/")
    hub = re.search(r"models--[^/]+?--([^/]+)", text)
    return (hub.group(1) if hub else text.split("/")[-1]).lower()


def model_name(ref) -> str | None:
    """A model reference as a person names it: `org/name` for a repo id or a
    folder of the HF cache (`models--org--name/snapshots/<hash>`), else the
    folder's name."""
    if not ref:
        return None
    text = str(ref).rstrip("/")
    hub = re.search(r"models--([^/]+?)--([^/]+)", text)
    if hub:
        return f"{hub.group(1)}/{hub.group(2)}"
    return text if REPO_ID.fullmatch(text) else Path(text).name


def adapter_config(path: Path) -> dict:
    """adapter_config.json, or {} when it is missing, unreadable or not a
    regular file (a FIFO there is never opened: a listing must not hang)."""
    try:
        config = read_json(path / "adapter_config.json", "adapter")
    except (OSError, ValueError):  # PathRefused included
        return {}
    return config if isinstance(config, dict) else {}


def describe(path: Path) -> dict:
    config = adapter_config(path)
    lora = config.get("lora_parameters") or {}
    weights = path / "adapters.safetensors"
    return {"path": str(path), "rank": lora.get("rank"), "scale": lora.get("scale"),
            "base_model": config.get("base_model") or config.get("model"), "method": config.get("method"),
            "size_bytes": weights.stat().st_size if weights.is_file() else 0,
            "partial": config.get("partial") if isinstance(config.get("partial"), dict) else None}


def register(path: str | Path, name: str | None = None, job=None, mounted: bool = False) -> Adapter:
    """Create or refresh the row of the adapter in `path`."""
    folder = Path(path).expanduser().resolve()
    info = describe(folder)
    fields = {k: info[k] for k in ("base_model", "rank", "scale", "method", "size_bytes")}
    if name:
        fields["name"] = name
    if job is not None:
        fields["job"] = job
    if mounted:
        fields["last_mounted_at"] = timezone.now()
    row, created = Adapter.objects.get_or_create(path=str(folder), defaults={"name": name or folder.name, **fields})
    if not created:
        Adapter.objects.filter(pk=row.pk).update(**fields)
        row.refresh_from_db()
    return row


def _usable(folder: Path) -> bool:
    """Weights that are a regular file (a FIFO in their place is no adapter),
    in a folder no fine-tune is still writing (or was killed writing)."""
    return (folder / "adapters.safetensors").is_file() and not (folder / TRAINING_MARKER).exists()


def available(mounted: list[dict], served_refs: list) -> list[dict]:
    """Every adapter folder found, with `mounted`, `compatible` (its
    recorded base is the served model by bare name, or it recorded none)
    and `base_model_name` (that base as `model_name` names it)."""
    folders: dict[str, str] = {}  # resolved path -> id
    root = home.adapters()
    if root.is_dir():
        for weights in sorted(root.glob("*/adapters.safetensors")) + sorted(root.glob("*/*/adapters.safetensors")):
            if _usable(weights.parent):
                folders.setdefault(str(weights.parent.resolve()), weights.parent.name)
    for row in Adapter.objects.all():
        if _usable(Path(row.path)):
            folders.setdefault(row.path, row.name)
    by_path = {m["path"]: m["id"] for m in mounted}
    for path, adapter_id in by_path.items():
        folders[path] = adapter_id
    served = {bare_name(ref) for ref in served_refs if ref}
    out = []
    for path, adapter_id in folders.items():
        info = describe(Path(path))
        base = bare_name(info["base_model"])
        out.append({"id": adapter_id, "path": path, "rank": info["rank"], "scale": info["scale"],
                    "base_model": info["base_model"], "base_model_name": model_name(info["base_model"]),
                    "mounted": path in by_path, "partial": info["partial"],
                    "compatible": base is None or base in served})
    return out
