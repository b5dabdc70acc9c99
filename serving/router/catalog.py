"""The models a router can serve: the Hugging Face cache's servable models,
plus every model folder under `--models-dir` (scanned recursively; a model
is named by its path relative to that folder), each with its preset from
`--models-preset` (aliases, tags, pin, idle unload, serve flags); or, for
`hearth serve MODEL --isolate`, that one model (`OneModel`).

Names resolve by id first, then by alias. An alias that clashes with
another model's id or alias, or a preset section naming no model, stops
start-up with the preset's file and line.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from hub import fit, registry
from serving.router import presets

log = logging.getLogger("hearth.router")

DEFAULT_WORDS = frozenset({"", "default"})  # a `model` that means "the default model"
PROCESS_BYTES = 160 << 20  # a model's process before its model: measured ~150 MiB resident on Linux


class CatalogError(ValueError):
    """A preset or folder that cannot be served as written (start-up stops)."""


@dataclass(frozen=True)
class Entry:
    id: str
    ref: str  # what the child serves: a repo id in the HF cache or a folder's absolute path
    preset: presets.Preset
    size_bytes: int | None = None
    weights_bytes: int | None = None
    params: int | None = None
    quant_bits: int | None = None
    config: dict = field(default_factory=dict, compare=False)

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.preset.aliases

    @property
    def tags(self) -> tuple[str, ...]:
        return self.preset.tags

    def estimated_bytes(self, usable: int) -> int | None:
        """What loading it should take: weights as this machine keeps them,
        a 4096-token KV cache, the engine's scratch reserve and the process
        itself (Python, Django, MLX: about 160 MiB resident before a model)."""
        if not self.weights_bytes:
            return None
        weights, itemsize = fit.resident_bytes(self.weights_bytes, self.params or 0, usable)
        kv = fit.kv_bytes_per_token(self.config, itemsize) if self.config else 0
        return weights + kv * 4096 + fit.TRANSIENT_RESERVE + PROCESS_BYTES


def _from_local(model: registry.LocalModel, ref: str, name: str, preset: presets.Preset) -> Entry:
    return Entry(id=name, ref=ref, preset=preset, size_bytes=model.size_bytes, weights_bytes=model.weights_bytes,
                 params=model.params, quant_bits=model.quant_bits, config=model.config)


def scan_folder(root: Path) -> dict[str, registry.LocalModel]:
    """Every folder under `root` holding a config.json and safetensors
    weights, by its path relative to `root` (symlinked folders are not
    followed, so a link cycle cannot hang the scan)."""
    found: dict[str, registry.LocalModel] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if "config.json" in files and any(f.endswith(".safetensors") for f in files):
            path = Path(folder)
            name = path.relative_to(root).as_posix()
            if name == ".":
                name = path.name
            try:
                found[name] = registry.describe(name, path, "")
            except (OSError, ValueError) as exc:
                log.warning("--models-dir: skipping %s: %s", path, exc)
            dirs[:] = []  # a model folder's subfolders are its own files
    return found


class Catalog:
    def __init__(self, entries: list[Entry]):
        self.entries = {e.id: e for e in entries}
        self._names: dict[str, str] = {e.id: e.id for e in entries}
        for entry in entries:
            for alias in entry.aliases:
                owner = self._names.get(alias)
                if owner is not None and owner != entry.id:
                    what = "the name of model" if alias == owner else "an alias of"
                    raise CatalogError(f"{entry.preset.source}: alias {alias!r} of {entry.id} is already "
                                       f"{what} {owner!r}")
                self._names[alias] = entry.id

    def resolve(self, name: str) -> Entry | None:
        model_id = self._names.get(name)
        return self.entries[model_id] if model_id is not None else None

    def ids(self) -> list[str]:
        return list(self.entries)


class Library:
    """Builds the catalog, again whenever the cache may have changed (a
    download finished, a model was removed): the presets are read once."""

    def __init__(self, models_dir: Path | None, preset_file: Path | None, extra: tuple[str, ...] = ()):
        self.models_dir = models_dir.expanduser().resolve() if models_dir is not None else None
        if self.models_dir is not None and not self.models_dir.is_dir():
            raise CatalogError(f"--models-dir {models_dir}: not a directory")
        self.table = presets.parse(preset_file) if preset_file is not None else {}
        self.extra = extra

    def scan(self, strict: bool = False) -> Catalog:
        """The catalog now: the cache, then the models folder (same name: the
        folder wins), then `extra` refs (a default model given as a path).
        `strict` (at start-up): a preset naming no model is an error."""
        local: dict[str, tuple[registry.LocalModel, str]] = {
            m.repo_id: (m, m.repo_id) for m in registry.scan() if m.supported}
        if self.models_dir is not None:
            for name, model in scan_folder(self.models_dir).items():
                if name in local and strict:
                    log.warning("--models-dir: %s shadows the cached model of the same name", name)
                local[name] = (model, str(model.path))
        for ref in self.extra:
            path = Path(ref).expanduser()
            if ref not in local and path.is_dir():
                local[ref] = (registry.describe(path.name, path.resolve(), ""), str(path.resolve()))
        for name, preset in self.table.items():
            if name != "*" and name not in local:
                message = f"{preset.source}: no model {name!r} in the library (the HF cache" \
                          f"{' or --models-dir' if self.models_dir else ''})"
                if strict:
                    raise CatalogError(message)
                log.warning("%s", message)
        return Catalog([_from_local(model, ref, name, presets.merged(self.table, name))
                        for name, (model, ref) in sorted(local.items())])


class OneModel(Library):
    """The library of `hearth serve MODEL --isolate`: that model alone, as
    its id and flags were settled at start (a rescan finds the same)."""

    def __init__(self, model_id: str, path: Path, preset: presets.Preset):
        super().__init__(None, None)
        self.entry = _from_local(registry.describe(model_id, path, ""), str(path), model_id, preset)

    def scan(self, strict: bool = False) -> Catalog:
        return Catalog([self.entry])
