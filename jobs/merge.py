"""Folding two LoRA adapters into one.

Stacking adapters adds their residuals: s_a * x A_a B_a + s_b * x A_b B_b.
That is exactly one LoRA of rank r_a + r_b with A = [A_a | A_b] and
B = [s_a B_a ; s_b B_b] at scale 1, so the merge is lossless. A layer only
one source has gets zero blocks for the other, keeping one rank for every
layer (as mlx-lm's loader expects). Pure numpy: no MLX in request threads.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

from core.paths import ADAPTER_FILES, PathRefused, confine, confine_members, read_json, regular_file


def _load(folder: Path, what: str) -> tuple[dict, dict]:
    from safetensors.numpy import load_file

    weights = folder / "adapters.safetensors"
    if not weights.exists():
        raise ValueError(f"{folder} holds no adapters.safetensors")
    regular_file(weights, what)  # again just before it is opened (PathRefused)
    try:
        tensors = load_file(str(weights))
    except Exception as exc:  # bf16 has no numpy dtype; a torn file
        raise ValueError(f"{weights} cannot be read: {exc}") from None
    try:
        config = read_json(folder / "adapter_config.json", what)
    except PathRefused:
        raise
    except (OSError, ValueError):  # missing or not JSON: the defaults
        config = {}
    if not isinstance(config, dict):
        config = {}
    if config.get("fine_tune_type", "lora") != "lora":
        raise ValueError(f"{folder} is not a LoRA adapter")
    return tensors, config


def _layers(tensors: dict, folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for key in tensors:
        module, _, leaf = key.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise ValueError(f"{folder.name}: {key} is not a LoRA weight")
        if module + ".lora_a" not in tensors or module + ".lora_b" not in tensors:
            raise ValueError(f"{folder.name}: {module} lacks lora_a or lora_b")
        a, b = tensors[module + ".lora_a"], tensors[module + ".lora_b"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"{folder.name}: {module}'s lora_a {list(a.shape)} and lora_b {list(b.shape)} are not "
                             "one LoRA (an input x rank and a rank x output matrix)")
        out[module] = (a, b)
    return out


def merge(first: str, second: str, out: Path, scales: list | None = None) -> dict:
    sources = [confine(first, "adapter_a"), confine(second, "adapter_b")]
    for folder, what in zip(sources, ("adapter_a", "adapter_b"), strict=True):
        confine_members(folder, ADAPTER_FILES, what)  # before anything is read
    loaded = [_load(folder, what) for folder, what in zip(sources, ("adapter_a", "adapter_b"), strict=True)]
    layers = [_layers(tensors, folder) for (tensors, _), folder in zip(loaded, sources, strict=True)]
    if scales is None:
        scales = [float((cfg.get("lora_parameters") or {}).get("scale", 20.0)) for _, cfg in loaded]
    if not all(abs(s) <= float(np.finfo(np.float32).max) for s in scales):  # float32 weights: 1e39 is inf
        raise ValueError(f"scales must be numbers a float32 holds (at most ~3.4e38), not {scales}")
    ranks = []
    for src, folder in zip(layers, sources, strict=True):
        found = {a.shape[1] for a, _ in src.values()}
        if len(found) != 1:
            raise ValueError(f"{folder.name} has layers of different ranks: {sorted(found)}")
        ranks.append(found.pop())
    merged, both, only_one = {}, 0, 0
    for module in sorted(set(layers[0]) | set(layers[1])):
        pairs = [src.get(module) for src in layers]
        present = [p for p in pairs if p is not None]
        in_dims, out_dims = present[0][0].shape[0], present[0][1].shape[1]
        if any(a.shape[0] != in_dims or b.shape[1] != out_dims for a, b in present):
            raise ValueError(f"{module}: the two adapters disagree on the layer's shape (different base models?)")
        a_parts, b_parts = [], []
        for pair, rank, scale in zip(pairs, ranks, scales, strict=True):
            if pair is None:
                a_parts.append(np.zeros((in_dims, rank), np.float32))
                b_parts.append(np.zeros((rank, out_dims), np.float32))
            else:
                a_parts.append(pair[0].astype(np.float32))
                with np.errstate(over="ignore"):
                    scaled = pair[1].astype(np.float32) * np.float32(scale)
                if not np.isfinite(scaled).all():  # a scale a float32 holds can still carry a weight past it
                    raise ValueError(f"{module}: lora_b times its scale {scale:g} is past what float32 holds (inf); "
                                     "use a smaller scale")
                b_parts.append(scaled)
        merged[module + ".lora_a"] = np.concatenate(a_parts, axis=1)
        merged[module + ".lora_b"] = np.concatenate(b_parts, axis=0)
        both, only_one = (both + 1, only_one) if len(present) == 2 else (both, only_one + 1)
    _write(out, merged, loaded, sum(ranks), sources, scales)
    return {"layers_merged": both, "layers_only_in_one": only_one, "total_keys_out": len(merged),
            "sources": [str(s) for s in sources], "scales": scales}


def _write(out: Path, merged: dict, loaded: list, rank: int, sources: list[Path], scales: list) -> None:
    from safetensors.numpy import save_file

    configs = [cfg for _, cfg in loaded]
    # The modules the merged tensors target, as mlx-lm's loader names them within a layer.
    keys = sorted({m.group(1) for k in merged for m in [re.search(r"layers\.\d+\.(.+)\.lora_[ab]$", k)] if m})
    lora = {"rank": rank, "scale": 1.0, "dropout": 0.0, **({"keys": keys} if keys else {})}
    bases = {cfg.get("base_model") for cfg in configs if cfg.get("base_model")}
    spans = [int(cfg.get("num_layers") or 0) for cfg in configs]
    layers = -1 if -1 in spans else max(spans) or \
        len({m.group(1) for k in merged for m in [re.search(r"layers\.(\d+)\.", k)] if m})
    out.mkdir(parents=True, exist_ok=False)
    tmp = out / "adapters.safetensors.tmp"
    save_file(merged, str(tmp))
    tmp.rename(out / "adapters.safetensors")
    (out / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": layers,
        "lora_parameters": lora, "base_model": bases.pop() if len(bases) == 1 else None, "method": "merge",
        "merged_from": [str(s) for s in sources], "merge_scales": scales, "created_at": time.time()}, indent=2))
